"""Issue 3's coverage bar: how many sketches of real tasks the feature formulas verify.

Runs the same check as ``gradtune symbolic verify`` (formulas vs TVM's PerStoreFeature on N
held-out random decisions per sketch) on every task of the benchmark models (examples/) and on
the TVMScript operator set (tests/ops), for the llvm target by default.

    .venv/bin/python bench/symbolic_coverage.py [--samples 10] [--models-only | --ops-only]
        [--target cuda]

Writes bench/results/symbolic_coverage[_ops][_TARGET].md (the target in the name unless llvm)
and prints a JSON summary as its last line.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("resnet18_like", "mobilenetv2_like", "transformer_encoder", "dcgan_like")


def main() -> None:
    import tvm

    from gradtune.frontend import load_model
    from gradtune.partition import partition
    from gradtune.symbolic.verify import load_tvmscript, summary, verify_module
    from gradtune.target import make_target, parse_target

    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    parser.add_argument("--models-only", action="store_true", help="skip the operator set")
    parser.add_argument("--ops-only", action="store_true", help="skip the benchmark models")
    parser.add_argument("--target", default="llvm", help="llvm (default) or cuda")
    args = parser.parse_args()
    target = make_target(parse_target(args.target))
    tasks = []
    for name in [] if args.ops_only else MODELS:
        model = load_model(ROOT / "examples" / f"{name}.py")
        _, found = partition(model.mod, model.params, target)
        for task in found:
            tasks.append((name, task.name, tvm.IRModule({"main": task.mod["main"]})))
    for path in sorted((ROOT / "tests" / "ops").glob("*.tvmscript")):
        if not args.models_only:
            tasks.append(("ops", path.stem, load_tvmscript(path)))
    lines = ["| set | task | sketches | verified | exact fraction | unverified (why) | s |"]
    lines.append("|---|---|---|---|---|---|---|")
    totals = {"sketches": 0, "verified": 0, "unverified": []}
    per_set: dict[str, list[int]] = {}
    for group, name, mod in tasks:
        start = time.perf_counter()
        reports = verify_module(mod, target, args.samples, seed=0)
        result = summary(reports, args.samples)
        seconds = time.perf_counter() - start
        totals["sketches"] += result["sketches"]
        totals["verified"] += result["verified_sketches"]
        counts = per_set.setdefault(group, [0, 0])
        counts[0] += result["sketches"]
        counts[1] += result["verified_sketches"]
        why = "; ".join(result["unsupported"])
        totals["unverified"] += [f"{group}/{name}: {u}" for u in result["unsupported"]]
        lines.append(
            f"| {group} | {name} | {result['sketches']} | {result['verified_sketches']} | "
            f"{result['exact_fraction']:.4f} | {why} | {seconds:.0f} |"
        )
        print(lines[-1], flush=True)
    lines.append("")
    for group, (s, v) in per_set.items():
        lines.append(f"- {group}: {v}/{s} sketches verified ({v / max(1, s):.1%})")
    s, v = totals["sketches"], totals["verified"]
    lines.append(f"- all: {v}/{s} sketches verified ({v / max(1, s):.1%}); bar 95%")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "symbolic_coverage" + ("_ops" if args.ops_only else "")
    name += "" if args.target == "llvm" else f"_{args.target}"
    header = f"# Symbolic coverage, target {args.target}, {args.samples} samples per sketch\n"
    (out / f"{name}.md").write_text(header + "\n" + "\n".join(lines) + "\n")
    print(
        json.dumps(
            {
                "target": args.target,
                "samples": args.samples,
                "sketches": totals["sketches"],
                "verified_sketches": totals["verified"],
                "per_set": {g: {"sketches": s, "verified": v} for g, (s, v) in per_set.items()},
                "unverified": totals["unverified"],
            }
        )
    )


if __name__ == "__main__":
    main()
