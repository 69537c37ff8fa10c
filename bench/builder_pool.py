"""What a build worker pool reused across batches saves against MetaSchedule's pool per batch.

Protocol:

1. **Candidates**: for each of the ``--tasks-per-model`` costliest tasks (untuned latency ×
   calls) of two models in no zoo (bench/models/mbconv_se.py, bench/models/bert_block.py), one
   batch of ``--batch`` random schedules (MetaSchedule's replay-trace sampling of the design
   space), the batch size of the CLI's rounds.
2. **Builders**, both with gradtune's ``fast_build`` on this CPU's physical cores:
   (a) MetaSchedule's ``LocalBuilder``, which starts a fresh worker pool for every batch (what
   ``gradtune tune`` used before the pooled builder);
   (b) ``gradtune.measure.builder.make_builder``: a pool reused across batches.
   Each builder is constructed once (its construction timed apart: LocalBuilder's sanity
   check starts a throwaway worker); then every batch is built by both, the order alternating
   from batch to batch and repeat to repeat, so that drift in the machine's load hits both.
3. **Per batch**: the median over ``--repeats`` (≥ 3) of its wall seconds with each builder,
   their ratio (a / b) and the seconds (b) saves; both must build the same candidates.

    .venv/bin/python bench/builder_pool.py [--batch 25] [--tasks-per-model 3] [--repeats 3]

Writes ``--out``/builder_pool.{md,json} (commit, machine, load averages); the last line
printed is one JSON object: ``{"batches", "repeats", "median_ratio_fresh_over_reused",
"median_saved_s_per_batch", "construct_s": {...}, "commit"}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from searchbench.api import random_schedules
from searchbench.layout import write_json
from searchbench.models import ROOT
from searchbench.report import conditions, git_commit, machine

MODELS = ("bench/models/mbconv_se.py", "bench/models/bert_block.py")
FRESH, REUSED = "pool per batch (LocalBuilder)", "reused pool (gradtune)"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=25, help="candidates per batch")
    parser.add_argument("--tasks-per-model", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3, help="builds of every batch (≥ 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    if args.repeats < 3:
        parser.error("--repeats must be at least 3")
    if args.batch < 1 or args.tasks_per_model < 1:
        parser.error("--batch and --tasks-per-model must be positive")
    return args


def sample_batches(
    batch: int, tasks_per_model: int, seed: int, target: Any, cores: int
) -> list[tuple[str, list[Any]]]:
    """(model/task, BuilderInputs) of the costliest tasks' random schedules."""
    from tvm.s_tir import meta_schedule as ms

    paths = [ROOT / path for path in MODELS]
    return [
        (f"{model}/{task}", [ms.builder.BuilderInput(c.sch.mod, target) for c in picks])
        for model, task, picks in random_schedules(
            paths, tasks_per_model, batch, seed, target, cores
        )
    ]


def timed(fn) -> tuple[Any, float]:
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import psutil
    from tvm.s_tir import meta_schedule as ms

    from gradtune.measure.builder import fast_build, make_builder, worker_lifeline
    from gradtune.target import make_target, parse_target

    config = parse_target(None)
    target = make_target(config)
    cores = psutil.cpu_count(logical=False) or 1
    batches = sample_batches(args.batch, args.tasks_per_model, args.seed, target, cores)
    load = [os.getloadavg()]
    builders, construct = {}, {}
    builders[FRESH], construct[FRESH] = timed(
        lambda: ms.builder.LocalBuilder(
            max_workers=cores, timeout_sec=60.0, f_build=fast_build, initializer=worker_lifeline()
        )
    )
    builders[REUSED], construct[REUSED] = timed(lambda: make_builder(max_workers=cores))
    seconds: dict[str, dict[str, list[float]]] = {n: {FRESH: [], REUSED: []} for n, _ in batches}
    failed: dict[str, dict[str, int]] = {name: {} for name, _ in batches}
    turn = 0
    try:
        for repeat in range(args.repeats):
            for name, inputs in batches:
                order = [FRESH, REUSED] if turn % 2 == 0 else [REUSED, FRESH]
                turn += 1
                for way in order:
                    build = builders[way].build
                    results, secs = timed(lambda build=build, inputs=inputs: build(inputs))
                    seconds[name][way].append(secs)
                    failed[name][way] = sum(r.error_msg is not None for r in results)
                    for r in results:
                        if r.artifact_path:
                            os.remove(r.artifact_path)
                took = ", ".join(f"{w} {seconds[name][w][-1]:.2f} s" for w in order)
                print(f"repeat {repeat + 1}/{args.repeats} {name}: {took}", flush=True)
            load.append(os.getloadavg())
    finally:
        builders[REUSED].shutdown()
    rows = []
    for name, inputs in batches:
        fresh = statistics.median(seconds[name][FRESH])
        reused = statistics.median(seconds[name][REUSED])
        rows.append({
            "batch": name, "candidates": len(inputs), "failed": failed[name],
            "fresh_s": fresh, "reused_s": reused, "ratio": fresh / reused,
            "saved_s": fresh - reused, "samples": seconds[name],
        })  # fmt: skip
    data = {
        "commit": git_commit(),
        "machine": machine(config),
        "repeats": args.repeats,
        "batch": args.batch,
        "construct_s": construct,
        "load_averages": [[round(x, 2) for x in la] for la in load],
        "rows": rows,
        "median_ratio_fresh_over_reused": statistics.median(r["ratio"] for r in rows),
        "median_saved_s_per_batch": statistics.median(r["saved_s"] for r in rows),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "builder_pool.json", data)
    (args.out / "builder_pool.md").write_text(markdown(data))
    print(json.dumps({
        "batches": len(rows), "repeats": args.repeats,
        "median_ratio_fresh_over_reused": data["median_ratio_fresh_over_reused"],
        "median_saved_s_per_batch": data["median_saved_s_per_batch"],
        "construct_s": construct, "commit": data["commit"],
    }))  # fmt: skip
    return 0


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "# Build worker pool: one per batch against one reused",
        "",
        conditions(data["commit"], data["machine"]) + f" Batches of {data['batch']} random "
        "schedules of the costliest tasks of mbconv_se and bert_block (in no zoo), each built "
        f"{data['repeats']} times by both builders, the order alternating; median seconds per "
        "batch. Load averages (1, 5, 15 min) before and after each repeat: "
        + "; ".join(" / ".join(f"{x:.1f}" for x in la) for la in data["load_averages"])
        + ".",
        "",
        f"| batch | candidates | {FRESH} s | {REUSED} s | ratio | saved s | failed builds "
        "(per batch / reused) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in data["rows"]:
        failed = f"{r['failed'][FRESH]} / {r['failed'][REUSED]}"
        lines.append(
            f"| {r['batch']} | {r['candidates']} | {r['fresh_s']:.2f} | {r['reused_s']:.2f} "
            f"| {r['ratio']:.2f} | {r['saved_s']:.2f} | {failed} |"
        )
    c = data["construct_s"]
    lines += [
        "",
        f"Median ratio {data['median_ratio_fresh_over_reused']:.2f}, median saving "
        f"{data['median_saved_s_per_batch']:.2f} s per batch: what every round of a tune "
        f"saves. Construction, once per tune: {FRESH} {c[FRESH]:.2f} s (its sanity check "
        f"starts a throwaway worker), {REUSED} {c[REUSED]:.2f} s.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
