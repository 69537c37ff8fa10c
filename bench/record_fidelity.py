"""Do a tune's recorded latencies say what its programs cost? Re-time them alone and compare.

A search learns from the order of its measurements: the cost model is fine-tuned on it and
each task ships its recorded fastest. A measurement taken while the host's cores do other work
(the next batch's search and build, another tune) is slower by however much that work took,
and the order it gives is partly the order of the interference. For each run database given
(a ``gradtune tune`` out directory's ``db``, or a search-benchmark run directory), this takes
the ``--tasks`` tasks with the most records, samples up to ``--per-task`` working records of
each, builds them once, and times every one ``--passes`` times, each pass in a fresh process
with nothing else of this script running, in a shuffled order, on the thread count the run's
target names (``num-cores``; TVM's runtime sizes its pool from ``TVM_NUM_THREADS``). A timing is
TVM's evaluator with the tune's defaults (``MeasureSettings``), the median of its repeats.

Per task it prints the recorded over the quiet latency (median and 90th percentile: above 1,
the run recorded its programs slower than they are), and Spearman's rank correlation of the
recorded latencies with the quiet ones, over all sampled records and over the 15 quiet
fastest (the ones a search chooses among), next to the same correlation between two quiet
passes (what the timing noise alone allows).

    .venv/bin/python bench/record_fidelity.py RUN [RUN ...] [--tasks 4] [--per-task 40] \\
        [--passes 3] [--work DIR] [--out DIR]

Resumable: built libraries and finished passes are kept under ``--work``. The last line
printed is one JSON object: ``{"runs": {run: {"tasks": {name: {...}}, "inflation_median",
"top15_spearman_median", "top15_noise_floor_median"}}, "tvm_threads": n, "commit": c}``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from searchbench.report import git_commit

TOP = 15  # a search's picks: each task's fastest few
DEFAULT_WORK = Path(__file__).resolve().parent / "work" / "record_fidelity"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", type=Path, help="run databases (or dirs with db/)")
    parser.add_argument("--tasks", type=int, default=4, help="tasks per run, most records first")
    parser.add_argument("--per-task", type=int, default=40, help="records sampled per task")
    parser.add_argument("--passes", type=int, default=3, help="quiet timing passes (≥ 3)")
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK, help="built libraries, passes")
    parser.add_argument("--out", type=Path, help="also write record_fidelity.{md,json} here")
    parser.add_argument("--one-pass", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one_pass:
        return args
    if not args.runs:
        parser.exit(2, "record_fidelity: name at least one run database\n")
    args.runs = [run / "db" if (run / "db").is_dir() else run for run in args.runs]
    for run in args.runs:
        if not (run / "database_tuning_record.json").is_file():
            parser.exit(2, f"record_fidelity: {run} holds no database_tuning_record.json\n")
    if args.passes < 3:
        parser.exit(2, "record_fidelity: --passes must be at least 3\n")
    if args.tasks < 1 or args.per_task < TOP:
        parser.exit(2, f"record_fidelity: need --tasks ≥ 1 and --per-task ≥ {TOP}\n")
    return args


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation as the cost model's metrics compute it (average ranks for
    ties); nan below 3 points."""
    from gradtune.costmodel.train import spearman as rank_correlation

    return rank_correlation(a, b) if len(a) >= 3 else float("nan")


def build(run: Path, out: Path, tasks: int, per_task: int) -> dict[str, Any]:
    """Build the sampled records of ``run`` into ``out``; their plan (kept: a rerun reuses it)."""
    import tvm
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms
    from tvm.target import Target

    plan_path = out / "plan.json"
    if plan_path.is_file():
        return json.loads(plan_path.read_text())
    out.mkdir(parents=True, exist_ok=True)
    by_task: dict[str, list[Any]] = {}
    for record in ms.database.JSONDatabase(work_dir=str(run)).get_all_tuning_records():
        secs = [float(s) for s in record.run_secs or []]
        if secs and max(secs) < 1e9:  # MetaSchedule's latency of a failed run
            key = str(tvm_ffi.structural_hash(record.workload.mod))
            by_task.setdefault(key, []).append(record)
    rng = random.Random(0)
    plan: dict[str, Any] = {"threads": None, "programs": []}
    for key in sorted(by_task, key=lambda k: -len(by_task[k]))[:tasks]:
        records = rng.sample(by_task[key], min(per_task, len(by_task[key])))
        name = f"w{key[:8]}"  # the database keeps no task names
        for i, record in enumerate(records):
            target = record.target or Target("llvm")
            plan["threads"] = plan["threads"] or int(target.attrs.get("num-cores", 0)) or None
            lib = out / f"{key}-{i}.so"
            sch = tvm.s_tir.Schedule(record.workload.mod)
            record.trace.apply_to_schedule(sch, remove_postproc=False)
            tvm.compile(sch.mod, target=target).export_library(str(lib))
            recorded = sorted(float(s) for s in record.run_secs)
            plan["programs"].append({
                "task": name, "lib": lib.name,
                "args": [[[int(x) for x in a.shape], str(a.dtype)] for a in record.args_info],
                "recorded_s": recorded[len(recorded) // 2],
            })  # fmt: skip
        print(f"built {len(records)} of {name} ({len(by_task[key])} records)", file=sys.stderr)
    plan_path.write_text(json.dumps(plan))
    return plan


def one_pass(out: Path, seed: int) -> dict[str, float]:
    """Quiet seconds per library of ``out``'s plan, timed in a shuffled order."""
    import numpy as np
    import tvm

    from gradtune.measure.runner import MeasureSettings

    settings = MeasureSettings()
    plan = json.loads((out / "plan.json").read_text())
    programs = list(plan["programs"])
    random.Random(seed).shuffle(programs)
    dev, rng, seconds = tvm.cpu(), np.random.default_rng(0), {}
    for program in programs:
        lib = tvm.runtime.load_module(str(out / program["lib"]))
        args = [
            tvm.runtime.tensor(rng.standard_normal(shape).astype(dtype), dev)
            for shape, dtype in program["args"]
        ]
        timer = lib.time_evaluator(
            "main", dev, number=settings.number, repeat=settings.repeat,
            min_repeat_ms=settings.min_repeat_ms,
        )  # fmt: skip
        seconds[program["lib"]] = statistics.median(timer(*args).results)
    return seconds


def timed_passes(out: Path, passes: int, threads: int | None) -> list[dict[str, float]]:
    env = dict(os.environ)
    if threads:
        env["TVM_NUM_THREADS"] = str(threads)
    done = []
    for k in range(passes):
        path = out / f"pass{k}.json"
        if not path.is_file():
            subprocess.run(
                [sys.executable, __file__, "--one-pass", str(out), "--seed", str(k)],
                env=env, check=True,
            )  # fmt: skip
        done.append(json.loads(path.read_text()))
        print(f"pass {k + 1}/{passes} of {out.name}", file=sys.stderr)
    return done


def task_rows(plan: dict[str, Any], passes: list[dict[str, float]]) -> dict[str, dict[str, Any]]:
    """Per task: recorded over quiet (median, p90), Spearman recorded-vs-quiet (all, top), and
    the median Spearman between two quiet passes (all, top): the noise floor."""
    rows: dict[str, dict[str, Any]] = {}
    for task in dict.fromkeys(p["task"] for p in plan["programs"]):
        progs = [p for p in plan["programs"] if p["task"] == task]
        recorded = [p["recorded_s"] for p in progs]
        each = [[done[p["lib"]] for p in progs] for done in passes]
        quiet = [statistics.median(col) for col in zip(*each, strict=True)]
        top = sorted(range(len(progs)), key=quiet.__getitem__)[:TOP]
        ratios = sorted(r / q for r, q in zip(recorded, quiet, strict=True))
        pairs = [(a, b) for i, a in enumerate(each) for b in each[i + 1 :]]
        rows[task] = {
            "n": len(progs),
            "quiet_best_us": round(min(quiet) * 1e6, 2),
            "recorded_best_us": round(min(recorded) * 1e6, 2),
            "inflation_median": round(statistics.median(ratios), 3),
            "inflation_p90": round(ratios[int(0.9 * (len(ratios) - 1))], 3),
            "spearman": round(spearman(recorded, quiet), 3),
            "top_spearman": round(spearman([recorded[i] for i in top], [quiet[i] for i in top]), 3),
            "noise_floor": round(statistics.median(spearman(a, b) for a, b in pairs), 3),
            "top_noise_floor": round(
                statistics.median(
                    spearman([a[i] for i in top], [b[i] for i in top]) for a, b in pairs
                ),
                3,
            ),
        }
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.one_pass:  # a child: one quiet pass, written where the parent reads it
        seconds = one_pass(args.one_pass, seed=args.seed)
        (args.one_pass / f"pass{args.seed}.json").write_text(json.dumps(seconds))
        return 0
    from gradtune import threads

    summary: dict[str, Any] = {}
    pools = set()
    lines: list[str] = []
    for run in args.runs:
        digest = hashlib.sha256(str(run.resolve()).encode()).hexdigest()[:10]
        out = args.work / f"{run.parent.name}-{digest}-{args.tasks}x{args.per_task}"
        plan = build(run, out, args.tasks, args.per_task)
        threads_n = plan["threads"] or threads.host_cores()
        pools.add(threads_n)
        rows = task_rows(plan, timed_passes(out, args.passes, threads_n))
        lines += [f"\n{run}  (TVM threads {threads_n})\n",
                  "| task | n | quiet best µs | recorded best µs | recorded/quiet median | p90 "
                  f"| Spearman all | top {TOP} | noise floor all | top {TOP} |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
        for task, r in rows.items():
            lines.append(
                f"| {task} | {r['n']} | {r['quiet_best_us']} | {r['recorded_best_us']} "
                f"| {r['inflation_median']} | {r['inflation_p90']} | {r['spearman']} "
                f"| {r['top_spearman']} | {r['noise_floor']} | {r['top_noise_floor']} |"
            )
        summary[str(run)] = {
            "tasks": rows,
            "inflation_median": statistics.median(r["inflation_median"] for r in rows.values()),
            "top15_spearman_median": statistics.median(r["top_spearman"] for r in rows.values()),
            "top15_noise_floor_median": statistics.median(
                r["top_noise_floor"] for r in rows.values()
            ),
        }
    pool = sorted(pools)
    result = {"runs": summary, "tvm_threads": pool[0] if len(pool) == 1 else pool,
              "commit": git_commit()}  # fmt: skip
    print("\n".join(lines))
    print(json.dumps(result))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        header = f"# Recorded vs quiet latencies (commit {result['commit']})\n"
        (args.out / "record_fidelity.md").write_text(header + "\n".join(lines) + "\n")
        (args.out / "record_fidelity.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
