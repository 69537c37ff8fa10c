"""The adaptive evaluator's accuracy and cost against fixed measurement, on real candidates.

Protocol:

1. **Candidates**: random schedules (MetaSchedule's replay-trace sampling of the design space)
   of the ``--tasks-per-model`` costliest tasks (untuned latency × calls) of two models in no
   zoo (bench/models/mbconv_se.py, bench/models/bert_block.py), ``--per-task`` each, built
   with gradtune's builder. Candidates that fail to build are dropped.
2. **Measurements**, over a local RPC fleet of one server, one session per task: each
   candidate's module is uploaded and its arguments allocated once, then it is measured three
   ways, interleaved in an order rotating per candidate (so drift in the machine's load hits
   every way alike):
   (a) ground truth: TVM's time_evaluator with number=10, repeat=10, min_repeat_ms=100;
   (b) gradtune's fixed measurement (number=3, repeat=3, min_repeat_ms=20);
   (c) the adaptive evaluator with its default settings, its task's best so far being the
   best latency (c) has measured of the task, as during tuning.
   (b) and (c) are the functions RPCRunner's workers call; their ledgers give kernel runs and
   device seconds.
3. **Latency** of a measurement: the median of its run_secs (what gradtune's tuning loop takes
   as a candidate's latency); error: |latency / truth - 1|.

Reported: device seconds per candidate of (b) and (c) and their ratio; the median |error| of
(b) and (c); wall seconds per measurement (RPC round trips included); the adaptive stops;
Spearman correlation with the truth; per task, how far the candidate each way would pick as
the best is from the truly best (in the truth's latency). The machine's load average is
recorded before, during and after.

    .venv/bin/python bench/adaptive_evaluator.py [--per-task 10] [--tasks-per-model 3]
    .venv/bin/python bench/adaptive_evaluator.py --render    # re-analyse the saved measurements

Writes ``--out``/adaptive_evaluator.{md,json}; the last line printed is one JSON object:
``{"candidates", "device_seconds_ratio_fixed_over_adaptive", "median_abs_error_fixed",
"median_abs_error_adaptive", "adaptive_stops", "goal_met", "load_average", "commit"}``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("bench/models/mbconv_se.py", "bench/models/bert_block.py")
TRUTH = {"number": 10, "repeat": 10, "min_repeat_ms": 100}


def sample_candidates(per_task: int, tasks_per_model: int, seed: int) -> list[dict[str, Any]]:
    """Built random candidates of the costliest tasks: task name, artifact, argument info."""
    import psutil
    from searchbench.api import random_schedules
    from tvm.s_tir import meta_schedule as ms

    from gradtune.measure.builder import make_builder
    from gradtune.target import make_target, parse_target

    target = make_target(parse_target(None))
    cores = psutil.cpu_count(logical=False) or 1
    builder = make_builder(max_workers=cores)
    candidates = []
    paths = [ROOT / path for path in MODELS]
    try:
        for model, task, picks in random_schedules(
            paths, tasks_per_model, per_task, seed, target, cores
        ):
            built = builder.build([ms.builder.BuilderInput(c.sch.mod, target) for c in picks])
            for cand, result in zip(picks, built, strict=True):
                if result.error_msg is None:
                    candidates.append({
                        "model": model, "task": task, "artifact": result.artifact_path,
                        "args_info": tuple(a.as_json() for a in cand.args_info),
                    })  # fmt: skip
    finally:
        builder.shutdown()
    return candidates


def last_ledger_line(path: str) -> dict[str, Any]:
    with open(path) as f:
        return json.loads(f.read().splitlines()[-1])


def measure_task(tracker, candidates: list[dict[str, Any]], offset: int) -> list[dict[str, Any]]:
    """Measure one task's candidates three ways in one RPC session (module docstring)."""
    import functools

    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.runner.rpc_runner import (
        default_alloc_argument,
        default_run_evaluator,
        default_upload_module,
    )

    from gradtune.measure.adaptive import (
        AdaptiveSettings,
        adaptive_run_evaluator,
        fixed_run_evaluator,
    )
    from gradtune.measure.runner import MeasureSettings

    fixed = MeasureSettings()
    config = ms.runner.RPCConfig(
        tracker_host=tracker.host, tracker_port=tracker.port, tracker_key=tracker.key,
        session_timeout_sec=3600,
    )  # fmt: skip
    session = config.connect_server()
    device = session.device("cpu", 0)
    ledgers = tempfile.mkdtemp(prefix="adaptive-bench-")
    ledger = {"fixed": f"{ledgers}/fixed.jsonl", "adaptive": f"{ledgers}/adaptive.jsonl"}
    best_s = math.inf
    rows = []
    for i, cand in enumerate(candidates):
        remote = f"cand{offset + i}.tar"
        rt_mod = default_upload_module(session, cand["artifact"], remote)
        args = default_alloc_argument(session, device, cand["args_info"], 1)
        ways = {
            "truth": functools.partial(
                default_run_evaluator, evaluator_config=ms.runner.EvaluatorConfig(**TRUTH)
            ),
            "fixed": functools.partial(
                fixed_run_evaluator, ledger=ledger["fixed"],
                evaluator_config=ms.runner.EvaluatorConfig(
                    number=fixed.number, repeat=fixed.repeat, min_repeat_ms=fixed.min_repeat_ms
                ),
            ),
            "adaptive": functools.partial(
                adaptive_run_evaluator, ledger=ledger["adaptive"], settings=AdaptiveSettings(),
                best_s=best_s, evaluator_config=ms.runner.EvaluatorConfig(),
            ),
        }  # fmt: skip
        order = list(ways)[i % 3 :] + list(ways)[: i % 3]
        row: dict[str, Any] = {"model": cand["model"], "task": cand["task"], "order": order}
        for way in order:
            start = time.perf_counter()
            run_secs = ways[way](session, rt_mod, device, repeated_args=args)
            row[f"{way}_wall_s"] = time.perf_counter() - start
            row[f"{way}_us"] = statistics.median(run_secs) * 1e6
            row[f"{way}_values"] = len(run_secs)
            if way != "truth":
                cost = last_ledger_line(ledger[way])
                row[f"{way}_device_s"] = cost["seconds"]
                row[f"{way}_runs"] = cost["runs"]
                row[f"{way}_stop"] = cost["stop"]
        best_s = min(best_s, row["adaptive_us"] * 1e-6)
        row["load1"] = os.getloadavg()[0]
        session.remove(remote)
        session.remove(remote + ".so")
        rows.append(row)
        print(
            f"{row['task'][:34]:34} truth {row['truth_us']:10.2f} µs | fixed "
            f"{row['fixed_us']:10.2f} µs {row['fixed_device_s'] * 1e3:7.1f} ms | adaptive "
            f"{row['adaptive_us']:10.2f} µs {row['adaptive_device_s'] * 1e3:7.1f} ms "
            f"{row['adaptive_stop']:9} | load {row['load1']:.2f}",
            flush=True,
        )
    return rows


def analyse(rows: list[dict[str, Any]]) -> dict[str, Any]:
    import numpy as np

    from gradtune.costmodel.train import spearman

    for row in rows:
        for way in ("fixed", "adaptive"):
            row[f"{way}_error"] = abs(row[f"{way}_us"] / row["truth_us"] - 1)
    totals = {w: sum(r[f"{w}_device_s"] for r in rows) for w in ("fixed", "adaptive")}
    walls = {w: sum(r[f"{w}_wall_s"] for r in rows) for w in ("fixed", "adaptive")}
    truth = [r["truth_us"] for r in rows]
    picks = {}
    for task in dict.fromkeys(r["task"] for r in rows):
        mine = [r for r in rows if r["task"] == task]
        best = min(r["truth_us"] for r in mine)
        picks[task] = {
            way: min(mine, key=lambda r, w=way: r[f"{w}_us"])["truth_us"] / best - 1
            for way in ("fixed", "adaptive")
        }
    stops = [r["adaptive_stop"] for r in rows]
    ratio = totals["fixed"] / totals["adaptive"]
    adaptive_error = statistics.median(r["adaptive_error"] for r in rows)
    return {
        "candidates": len(rows),
        "device_s_per_candidate": {w: totals[w] / len(rows) for w in totals},
        "device_seconds_ratio_fixed_over_adaptive": ratio,
        "median_candidate_ratio": statistics.median(
            r["fixed_device_s"] / r["adaptive_device_s"] for r in rows
        ),
        "wall_s_per_candidate": {w: walls[w] / len(rows) for w in walls},
        "median_abs_error": {
            w: statistics.median(r[f"{w}_error"] for r in rows) for w in ("fixed", "adaptive")
        },
        # The sign: short windows that happen to miss other jobs' time slices read fast.
        "median_signed_error": {
            w: statistics.median(r[f"{w}_us"] / r["truth_us"] - 1 for r in rows)
            for w in ("fixed", "adaptive")
        },
        "median_abs_error_by_stop": {
            stop: {
                "candidates": stops.count(stop),
                **{
                    w: statistics.median(
                        r[f"{w}_error"] for r in rows if r["adaptive_stop"] == stop
                    )
                    for w in ("fixed", "adaptive")
                },
            }
            for stop in sorted(set(stops))
        },
        "p90_abs_error": {
            w: sorted(r[f"{w}_error"] for r in rows)[int(0.9 * (len(rows) - 1))]
            for w in ("fixed", "adaptive")
        },
        "spearman_vs_truth": {
            # Tie-averaged ranks, the cost model's own metric: equal latencies rank alike.
            w: spearman(np.array(truth), np.array([r[f"{w}_us"] for r in rows]))
            for w in ("fixed", "adaptive")
        },
        "pick_loss_vs_true_best": picks,  # per task: truth latency of each way's pick / best - 1
        "adaptive_stops": {s: stops.count(s) for s in sorted(set(stops))},
        "adaptive_batches_median": statistics.median(r["adaptive_values"] for r in rows),
        # The goal: >= 2x fewer device seconds at a median error <= 2%.
        "goal_met": ratio >= 2 and adaptive_error <= 0.02,
    }


def conditions() -> dict[str, Any]:
    from searchbench.report import git_commit

    cpu = next(
        (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if "model name" in line),
        platform.processor(),
    )
    return {
        "commit": git_commit(),  # "<sha> dirty" with uncommitted changes to the code
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "load_average_before": list(os.getloadavg()),
    }


def write_markdown(path: Path, result: dict[str, Any]) -> None:
    s, c, rows = result["summary"], result["conditions"], result["rows"]

    def loads(values: list[float]) -> str:
        return " / ".join(f"{v:.2f}" for v in values)

    lines = [
        "# Adaptive evaluator vs fixed measurement",
        "",
        f"Measured at commit {c['commit']}, "
        f"{c['date']}, "
        f"{c['cpu']} ({c['cores']} logical cores), local RPC fleet of one server.",
        f"Load average (1/5/15 min) before {loads(c['load_average_before'])}, after "
        f"{loads(c['load_average_after'])}; 1-min during: median {c['load1_median']:.2f}, max "
        f"{c['load1_max']:.2f}. The machine was shared with other jobs: every measurement "
        "here, the ground truth included, is noisier than on an idle machine.",
        "",
        f"{s['candidates']} random candidates of {len(s['pick_loss_vs_true_best'])} tasks; "
        "ground truth number=10 × repeat=10 × ≥ 100 ms; fixed number=3 × repeat=3 × ≥ 20 ms; "
        f"adaptive {c['settings']['adaptive']}.",
        "",
        "| | fixed | adaptive |",
        "|---|---|---|",
    ]
    for label, key, fmt in (
        ("device ms per candidate", "device_s_per_candidate", "{:.1f}"),
        ("wall ms per candidate (RPC incl.)", "wall_s_per_candidate", "{:.1f}"),
    ):
        vals = [fmt.format(s[key][w] * 1e3) for w in ("fixed", "adaptive")]
        lines.append(f"| {label} | {vals[0]} | {vals[1]} |")
    for label, key in (("median abs latency error", "median_abs_error"),
                       ("median signed latency error", "median_signed_error"),
                       ("90th pct abs latency error", "p90_abs_error")):  # fmt: skip
        sign = "+" if key == "median_signed_error" else ""
        lines.append(f"| {label} | {s[key]['fixed']:{sign}.2%} | {s[key]['adaptive']:{sign}.2%} |")
    sp = s["spearman_vs_truth"]
    lines += [
        f"| Spearman vs truth | {sp['fixed']:.3f} | {sp['adaptive']:.3f} |",
        "",
        f"Device seconds, fixed / adaptive: {s['device_seconds_ratio_fixed_over_adaptive']:.2f}× "
        f"in total, median per candidate {s['median_candidate_ratio']:.2f}×. Adaptive stops: "
        f"{s['adaptive_stops']}; median micro-batches {s['adaptive_batches_median']}.",
        "",
        "Median abs error by how the adaptive evaluator stopped:",
        "",
        "| adaptive stop | candidates | fixed | adaptive |",
        "|---|---|---|---|",
        *(
            f"| {stop} | {e['candidates']} | {e['fixed']:.1%} | {e['adaptive']:.1%} |"
            for stop, e in s["median_abs_error_by_stop"].items()
        ),
        "",
        "Goal (≥ 2× fewer device seconds at a median error ≤ 2% against the truth): "
        f"{'met' if s['goal_met'] else 'not met'}.",
        "",
        "Per task, the truth latency of the candidate each way ranks fastest, over the truly "
        "fastest (0% = it picks the best):",
        "",
        "| task | fixed | adaptive |",
        "|---|---|---|",
    ]
    for task, loss in s["pick_loss_vs_true_best"].items():
        lines.append(f"| {task} | {loss['fixed']:.1%} | {loss['adaptive']:.1%} |")
    lines += [
        "",
        "| task | truth µs | fixed µs | err | device ms | adaptive µs | err | device ms | stop | "
        "batches |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['task']} | {r['truth_us']:.2f} | {r['fixed_us']:.2f} | {r['fixed_error']:.1%} "
            f"| {r['fixed_device_s'] * 1e3:.1f} | {r['adaptive_us']:.2f} | "
            f"{r['adaptive_error']:.1%} | {r['adaptive_device_s'] * 1e3:.1f} | "
            f"{r['adaptive_stop']} | {r['adaptive_values']} |"
        )
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-task", type=int, default=10, help="candidates per task")
    parser.add_argument("--tasks-per-model", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument(
        "--render", action="store_true", help="only re-analyse --out's saved measurements"
    )
    args = parser.parse_args(argv)
    if args.render:
        result = json.loads((args.out / "adaptive_evaluator.json").read_text())
        return report(args.out, result["conditions"], result["rows"])

    from gradtune.measure.adaptive import AdaptiveSettings
    from gradtune.measure.rpc_fleet import LocalFleet

    cond = conditions()
    cond["settings"] = {"adaptive": AdaptiveSettings()._asdict(), "truth": TRUTH}
    candidates = sample_candidates(args.per_task, args.tasks_per_model, args.seed)
    print(f"{len(candidates)} candidates built; load average {os.getloadavg()}", flush=True)
    rows: list[dict[str, Any]] = []
    with LocalFleet() as tracker:
        for task in dict.fromkeys(c["task"] for c in candidates):
            mine = [c for c in candidates if c["task"] == task]
            rows += measure_task(tracker, mine, len(rows))
    loads = [r["load1"] for r in rows]
    cond.update(
        load_average_after=list(os.getloadavg()),
        load1_median=statistics.median(loads),
        load1_max=max(loads),
    )
    return report(args.out, cond, rows)


def report(out: Path, cond: dict[str, Any], rows: list[dict[str, Any]]) -> int:
    """Write the results files and print the summary line."""
    summary = analyse(rows)
    result = {"conditions": cond, "summary": summary, "rows": rows}
    out.mkdir(parents=True, exist_ok=True)
    write_markdown(out / "adaptive_evaluator.md", result)
    (out / "adaptive_evaluator.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({
        "candidates": summary["candidates"],
        "device_seconds_ratio_fixed_over_adaptive": summary[
            "device_seconds_ratio_fixed_over_adaptive"
        ],
        "median_abs_error_fixed": summary["median_abs_error"]["fixed"],
        "median_abs_error_adaptive": summary["median_abs_error"]["adaptive"],
        "adaptive_stops": summary["adaptive_stops"],
        "goal_met": summary["goal_met"],
        "load_average": {"before": cond["load_average_before"],
                         "after": cond["load_average_after"], "during_max": cond["load1_max"]},
        "commit": cond["commit"],
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
