"""Does compiling the VM's own function pay? A tuned model built with ``relax.build``'s
``exec_mode="bytecode"`` (the VM interprets its instructions) against ``"compiled"`` (the same
calls as one PrimFunc compiled into the library), the same kernels in both.

``bench/vm_breakdown.py`` found inferences running 1.16-2.11x the sum of their kernels on a
2-core Zen 2, most on bert_block, the model of most and smallest kernels. Part of that is the
VM: each call instruction looks up its function, converts its registers to arguments and
dispatches; allocation and shape checks are instructions too. Compiled, the instructions are
straight-line code; the builtins are still called, the kernels are the same. For each
``gradtune tune`` out directory (its ``run.json`` names the model, entry, target and
lowering; its database holds the schedules, as ``gradtune tune`` compiles them), this:

1. imports and lowers the model as the run did, builds it both ways with the run's database;
2. checks that both give the same outputs, and that the compiled library, exported and loaded
   back as a deployment loads ``model.so``, gives them too;
3. times both interleaved in one process, round by round (``compilation.time_rounds``: the
   order alternates each round, the cross-core probe marks rounds with the cores apart), and
   prints the medians and the median of the per-round ratios.

    .venv/bin/python bench/vm_exec.py RUN_DIR [RUN_DIR ...] [--rounds 21] [--out DIR]

The last line printed is one JSON object: ``{"libraries": {name: {"bytecode_us",
"compiled_us", "bytecode_over_compiled", "ratio_range", "state", "kept_rounds"}},
"geomean_bytecode_over_compiled": g, "tvm_threads": n, "commit": c}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from searchbench.analysis import geomean  # noqa: E402  (bench/ is on the path from here)
from searchbench.report import git_commit, labels  # noqa: E402
from tuned_library import rebuild  # noqa: E402

MODES = ("bytecode", "compiled")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="gradtune tune out directories")
    parser.add_argument("--rounds", type=int, default=21, help="interleaved rounds (≥ 7)")
    parser.add_argument("--out", type=Path, default=None, help="write vm_exec.{md,json} here")
    args = parser.parse_args(argv)
    for run in args.runs:  # every bad input is refused before any work
        for name in ("run.json", "database_workload.json"):
            if not (run / name).is_file():
                parser.exit(2, f"vm_exec: {run} has no {name} (not a gradtune tune out dir)\n")
    if args.rounds < 7:
        parser.exit(2, "vm_exec: --rounds must be at least 7\n")
    return args


def builds(run: Path) -> dict[str, Any]:
    """The run's model built each way (``compilation.Runner`` per mode); both modes' outputs,
    and the exported compiled library's, checked against each other."""
    import numpy as np
    import tvm

    from gradtune import compilation

    executables, inputs, target = rebuild(run, MODES)
    runners = {mode: compilation.Runner(e, target, inputs) for mode, e in executables.items()}
    outputs = {mode: runner.outputs() for mode, runner in runners.items()}
    with tempfile.TemporaryDirectory() as tmp:
        lib = compilation.export(executables["compiled"], Path(tmp) / "model.so")
        vm, dev = compilation.load_exported(lib, target)
        args = [tvm.runtime.tensor(x, dev) for x in inputs]
        outputs["compiled, exported"] = compilation.flatten_outputs(vm["main"](*args))
    for mode, got in outputs.items():
        if any(not np.array_equal(a, b) for a, b in zip(got, outputs["bytecode"], strict=True)):
            raise SystemExit(f"vm_exec: {run}: the {mode} build's outputs differ from bytecode's")
    return runners


def time_library(run: Path, rounds: int) -> dict[str, Any]:
    from gradtune import compilation

    runners = builds(run)
    timing = compilation.time_rounds({m: r.run for m, r in runners.items()}, repeats=rounds)
    kept = timing.kept()
    ratios = [b / c for b, c in zip(kept["bytecode"], kept["compiled"], strict=True)]
    conditions = timing.conditions()
    return {
        "bytecode_us": 1e3 * statistics.median(kept["bytecode"]),
        "compiled_us": 1e3 * statistics.median(kept["compiled"]),
        "bytecode_over_compiled": statistics.median(ratios),
        "ratio_range": [min(ratios), max(ratios)],
        "state": conditions["state"],
        "kept_rounds": f"{conditions['kept_rounds']}/{conditions['rounds']}",
    }


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# VM bytecode vs compiled (commit {result['commit']}, "
        f"{result['tvm_threads']} TVM threads)",
        "",
        "| library | bytecode µs | compiled µs | bytecode / compiled (range) | rounds kept |",
        "|---|---:|---:|---:|---|",
    ]
    for name, r in result["libraries"].items():
        lo, hi = r["ratio_range"]
        lines.append(
            f"| {name} | {r['bytecode_us']:.1f} | {r['compiled_us']:.1f} | "
            f"{r['bytecode_over_compiled']:.3f} ({lo:.3f}-{hi:.3f}) | "
            f"{r['kept_rounds']} {r['state']} |"
        )
    lines += ["", f"Geomean bytecode / compiled: {result['geomean_bytecode_over_compiled']:.3f}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from gradtune.threads import runtime_threads

    libraries = {
        name: time_library(run, args.rounds)
        for name, run in zip(labels(args.runs), args.runs, strict=True)
    }
    ratios = [r["bytecode_over_compiled"] for r in libraries.values()]
    result = {
        "libraries": libraries,
        "geomean_bytecode_over_compiled": geomean(ratios),
        "tvm_threads": runtime_threads(),
        "commit": git_commit(),
    }
    table = markdown(result)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "vm_exec.json").write_text(json.dumps(result, indent=1) + "\n")
        (args.out / "vm_exec.md").write_text(table)
    print(table)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
