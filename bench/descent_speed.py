"""How long the gradient search's descent takes per round at this checkout against another
commit's, side by side, and whether its picks are the same.

In a tune, the descent (``GradientSearch._search``) is most of what the search costs: on a
2-core Intel Xeon a round took ~9 s (25 picks), about as long as building and measuring the
batch it picks. Most of that is not the arithmetic: every seed is rounded to integer decisions
at each of the 64 steps, and each new point is a program to apply in TVM and extract features
from (``SymbolicSketch.replay``; ~35 ms each, ~185 per round on mbconv_se's largest
convolution). A change that only makes that cheaper must leave the picks alone; this says both.

Protocol: the largest task (by FLOPs) of each model, a fresh ``GradientSearch`` at today's
defaults but without the explorer (its evolution is TVM's) and one seed for every trial; two
rounds, each the batch chosen (``descent_s`` from the search's own account), then 25
synthetic results to learn from. Each trial is its own process, run from this checkout or from
a worktree of ``--against``, alternating which goes first, ``--repeats`` times each. The picks
of every trial are compared with the first trial's.

    .venv/bin/python bench/descent_speed.py --against REV [--repeats 3] [--models ...]

Prints a table and, last, one JSON object: ``{"tasks": {name: {"descent_s": {"this": s,
"against": s}, "speedup": against_over_this, "same_picks": bool}}, "geomean_speedup": g,
"commit": c, "against": rev}``. Measure on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from searchbench.descent import add_trial_args, check_trial_args, descent_rounds, largest_task

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 2


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", help="the commit to compare with (e.g. HEAD~1)")
    add_trial_args(parser, 3, "side")
    parser.add_argument("--trial", nargs=2, metavar=("MODEL", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.trial:
        return args
    check_trial_args(parser, args, "descent_speed")
    if not args.against:
        parser.exit(2, "descent_speed: --against REV is required\n")
    rev = f"{args.against}^{{commit}}"
    found = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", rev],
                           capture_output=True, text=True)  # fmt: skip
    if found.returncode != 0:
        parser.exit(2, f"descent_speed: {args.against} is not a commit of this repository\n")
    args.against_sha = found.stdout.strip()
    return args


def trial(model: str, out: Path) -> None:
    """Two rounds of the descent on the model's largest task, with whichever ``gradtune`` is
    first on the path; writes {"descent_s", "picks", "task", "package"} to ``out``."""
    import gradtune
    from gradtune.target import host_cpu_target, make_target
    from gradtune.tvm_compat import register_tensor_intrinsics

    target = make_target(host_cpu_target())
    register_tensor_intrinsics("llvm")
    task = largest_task(model, target)
    rounds = descent_rounds(task, target, ROUNDS)
    out.write_text(json.dumps({
        "descent_s": sum(r["descent_s"] for r in rounds),
        "picks": [p for r in rounds for p in r["picks"]],
        "task": task.name,
        "package": str(Path(gradtune.__file__).parent.parent),
    }))  # fmt: skip


def run_trial(root: Path, model: str, scratch: Path) -> dict[str, Any]:
    """One trial in its own process, importing ``gradtune`` from ``root``."""
    out = scratch / f"trial-{time.monotonic_ns()}.json"
    env = {**os.environ, "PYTHONPATH": str(root)}
    # This file runs the trial either way: only the package under test changes.
    subprocess.run([sys.executable, str(Path(__file__).resolve()), "--trial", model, str(out)],
                   env=env, cwd=root, check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    result = json.loads(out.read_text())
    if Path(result["package"]).resolve() != root.resolve():
        raise RuntimeError(f"the trial imported gradtune from {result['package']}, not {root}")
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.trial:
        trial(args.trial[0], Path(args.trial[1]))
        return 0
    from searchbench.report import git_commit

    tasks: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="descent-speed-") as scratch:
        other = Path(scratch) / "against"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet",
                        str(other), args.against_sha], check=True)  # fmt: skip
        try:
            roots = {"this": ROOT, "against": other}
            for model in args.models:
                runs: dict[str, list[dict[str, Any]]] = {"this": [], "against": []}
                for i in range(args.repeats):
                    for side in ("this", "against") if i % 2 == 0 else ("against", "this"):
                        runs[side].append(run_trial(roots[side], model, Path(scratch)))
                        print(f"{model} {side}: descent {runs[side][-1]['descent_s']:.2f} s",
                              file=sys.stderr)  # fmt: skip
                reference = runs["this"][0]["picks"]
                same = all(t["picks"] == reference for side in runs for t in runs[side])
                descent = {s: statistics.median(t["descent_s"] for t in runs[s]) for s in runs}
                tasks[f"{model}/{runs['this'][0]['task']}"] = {
                    "descent_s": descent,
                    "speedup": descent["against"] / descent["this"],
                    "same_picks": same,
                }
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(other)],
                           check=False)  # fmt: skip
    commit = git_commit()
    print(f"| task | descent s, {args.against_sha[:7]} | descent s, {commit} | "
          f"speedup | same picks |\n|---|---|---|---|---|")  # fmt: skip
    for name, row in tasks.items():
        print(f"| {name} | {row['descent_s']['against']:.2f} | {row['descent_s']['this']:.2f} | "
              f"{row['speedup']:.2f} | {'yes' if row['same_picks'] else 'NO'} |")  # fmt: skip
    geomean = math.exp(statistics.fmean(math.log(r["speedup"]) for r in tasks.values()))
    print(f"descent per round, {args.against_sha[:7]} over {commit} (geomean of medians of "
          f"{args.repeats}, {ROUNDS} rounds each): {geomean:.2f}")  # fmt: skip
    print(json.dumps({"tasks": tasks, "geomean_speedup": geomean, "commit": commit,
                      "against": args.against_sha}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
