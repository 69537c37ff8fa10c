"""How many torch threads the gradient search's descent should run on: its time per round and
whether its picks change, one thread against the process's default, side by side.

The descent (``GradientSearch._search``: Adam over the relaxed decisions of 8 seeds, the
symbolic features and the MLP evaluated 64 times per sketch) and the online fine-tune run in
the tuning process on tensors of a few dozen rows. In ``bench/adatune_ablation.py``'s 300 s runs
on a 2-core Intel Xeon, choosing candidates took 32-43% of each run's wall time (the device's
timing 1-9%), and the descent was 4-8 s of a warm-up round's 8-15 s. torch splits each op over
``torch.get_num_threads()`` threads (the core count), which for matrices of this size may cost
more in hand-offs than it gains.

Protocol: the largest task (by FLOPs) of each model, a fresh ``GradientSearch`` at today's
defaults but without the explorer (its evolution is TVM's, on TVM's own threads) and the same
seed for every trial; two rounds, each: the batch chosen (``descent_s`` from the search's own
account), then 25 synthetic results to learn from (``notify_runner_results``: the fine-tune,
timed). Trials alternate the thread count, first one then the other, ``--repeats`` times each.
The picks of every trial are compared with the first trial's: the same decisions in the same
order mean the thread count changed only the time.

    .venv/bin/python bench/descent_threads.py [--repeats 5] [--models small_cnn mbconv_se]

Prints a table and, last, one JSON object: ``{"tasks": {name: {"descent_s": {threads: s},
"finetune_s": {threads: s}, "speedup": default_over_one, "same_picks": bool}},
"geomean_speedup": g, "default_threads": n, "commit": c}``. Measure on an otherwise idle
machine: nothing else about a 2-core host's timing is steady.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from typing import Any

from searchbench.descent import add_trial_args, check_trial_args

ROUNDS = 2


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_trial_args(parser, 5, "thread count")
    args = parser.parse_args(argv)
    check_trial_args(parser, args, "descent_threads")
    return args


def trial(task: Any, target: Any, threads: int) -> dict[str, Any]:
    """Two rounds of the descent on ``task`` with torch on ``threads`` threads."""
    import torch
    from searchbench.descent import descent_rounds

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        rounds = descent_rounds(task, target, ROUNDS)
    finally:
        torch.set_num_threads(before)
    return {
        "descent_s": sum(r["descent_s"] for r in rounds),
        "finetune_s": sum(r["finetune_s"] for r in rounds),
        "picks": [p for r in rounds for p in r["picks"]],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    from searchbench.descent import largest_task
    from searchbench.report import git_commit

    from gradtune.target import host_cpu_target, make_target
    from gradtune.tvm_compat import register_tensor_intrinsics

    default = torch.get_num_threads()
    counts = [1, default] if default != 1 else [1, 2]
    target = make_target(host_cpu_target())
    register_tensor_intrinsics("llvm")
    tasks: dict[str, Any] = {}
    for model in args.models:
        task = largest_task(model, target)
        runs: dict[int, list[dict[str, Any]]] = {n: [] for n in counts}
        for i in range(args.repeats):
            for n in counts if i % 2 == 0 else counts[::-1]:
                runs[n].append(trial(task, target, n))
        reference = runs[counts[0]][0]["picks"]
        same = all(t["picks"] == reference for n in counts for t in runs[n])
        descent = {n: statistics.median(t["descent_s"] for t in runs[n]) for n in counts}
        finetune = {n: statistics.median(t["finetune_s"] for t in runs[n]) for n in counts}
        tasks[f"{model}/{task.name}"] = {
            "descent_s": descent,
            "finetune_s": finetune,
            "speedup": (descent[counts[1]] + finetune[counts[1]]) / (descent[1] + finetune[1]),
            "same_picks": same,
        }
    print(f"| task | threads | descent s (median of {args.repeats}, {ROUNDS} rounds) | "
          "fine-tune s | same picks |")  # fmt: skip
    print("|---|---|---|---|---|")
    for name, row in tasks.items():
        for n in counts:
            print(f"| {name} | {n} | {row['descent_s'][n]:.2f} | {row['finetune_s'][n]:.2f} | "
                  f"{'yes' if row['same_picks'] else 'NO'} |")  # fmt: skip
    speedups = [row["speedup"] for row in tasks.values()]
    geomean = math.exp(statistics.fmean(math.log(s) for s in speedups))
    print(f"descent + fine-tune, {counts[1]} threads over 1 (geomean): {geomean:.2f}")
    print(json.dumps({"tasks": tasks, "geomean_speedup": geomean, "default_threads": default,
                      "commit": git_commit()}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
