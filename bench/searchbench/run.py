"""One tuning run (model, searcher, repeat) with a real deadline, then its truncated builds.

The clock starts just before ``tune`` is called. A timer sets the run's stop signal at the
budget: the strategy then hands out no more candidates. Work already under way still ends
(a generation in progress, a batch being built and measured), so the run overruns a little;
its wall time and overrun are recorded, and the evaluation counts only what was measured by
the budget. Every measured batch is logged with its wall-clock time and the cumulative trial
count; the JSONDatabase appends one record per measured candidate in measurement order, so
its first N records are exactly the database as it stood at that time. (A batch is logged
when the task scheduler joins it, which is also when its records are committed; gradtune's
joins each batch once it is measured, in the warm-up round too, ``search/scheduler.py``.)

At ¼, ½ and the whole budget the model is compiled with the database cut to the records
measured by then, its outputs checked against the source framework, and the library exported
for the interleaved end-to-end timing. At the whole budget that is what ``gradtune tune``
ships: with a confirmation (``--confirm K``, ``gradtune.measure.confirm``), its winners.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from searchbench import api
from searchbench.layout import FRACTIONS, Layout, RunSpec
from searchbench.models import MODELS
from searchbench.report import git_commit

DB = "db"  # the run's tune() work dir (JSONDatabase + MetaSchedule logs)
WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"


def tune_until_deadline(
    spec: RunSpec, tasks: list[Any], target: Any, tracker: Any, budget: float, run_dir: Path,
    weights: Path | None, gradient: dict[str, Any] | None = None,
    warm_start: Any = None, search: bool = True, measure: str = "fixed",
    cost_model: Any = "xgb", warmup: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Tune; returns the rounds (wall-clock stamped), wall time and the searcher's summary.

    ``warm_start`` (``transfer.run.Transfer``) measures transferred schedules before the
    search, inside the clock; ``search`` False: nothing else (a transfer, no deadline);
    ``cost_model`` the task scheduler's (``api.scheduler_cost_model``); ``warmup``
    ``gradtune tune --warmup`` (None: its default)."""
    strategy = (
        api.make_searcher(spec.searcher, target.kind.name, weights, gradient) if search else None
    )
    rounds: list[dict[str, Any]] = []
    start = time.perf_counter()

    def on_round(record: Any) -> None:
        rounds.append({
            "wall_s": round(time.perf_counter() - start, 3),
            "tune_s": round(record.seconds, 3),  # tune()'s own clock, started a little later
            "trials": record.trials,
            "task": record.task,
            "estimated_us": record.estimated_model_us,
            # The gradient search's account of the batch (what each side of it found).
            **({"search": asdict(record.search)} if record.search is not None else {}),
        })  # fmt: skip

    # On Ctrl-C / SIGTERM, tune() sets its stop signal and raises KeyboardInterrupt once TVM
    # has returned; the fleet then stops.
    timer = api.stop_at(strategy, budget) if search else None
    try:
        result = api.tune(
            tasks, target, run_dir / DB, tracker, budget, strategy, seed=spec.repeat,
            trials_per_round=spec.per_round, on_round=on_round, warm_start=warm_start,
            measure=measure, cost_model=cost_model, warmup=warmup,
        )  # fmt: skip
    finally:
        if timer is not None:
            timer.cancel()
    wall = time.perf_counter() - start
    return {
        "rounds": rounds,
        "wall_s": round(wall, 2),
        "overrun_pct": round(100 * (wall - budget) / budget, 2),
        "trials_total": result.trials,
        "search_summary": api.search_summary(result),
        "measure": measure,
        "warmup": result.warmup,  # how the task scheduler's first batches went round
        # Device time spent timing candidates, and kernel executions (``MeasureCost``).
        "measure_seconds": round(result.measure_cost.seconds, 3),
        "kernel_runs": result.measure_cost.kernel_runs,
        "measured_candidates": result.measure_cost.candidates,
        # After a warm start: the tasks whose warm-up batch the task scheduler skipped.
        **({"warmup_skipped": result.warmup_skipped} if warm_start is not None else {}),
    }


def records_by(rounds: list[dict[str, Any]], seconds: float) -> int:
    """Trials (= database records) measured by ``seconds`` of wall-clock time."""
    return max((r["trials"] for r in rounds if r["wall_s"] <= seconds), default=0)


def estimate_by(rounds: list[dict[str, Any]], seconds: float) -> float | None:
    """Best estimated model latency (µs) reached by ``seconds``; None before the first batch."""
    values = [r["estimated_us"] for r in rounds if r["wall_s"] <= seconds]
    finite = [v for v in values if math.isfinite(v)]
    return min(finite) if finite else None


def truncated_database(run_dir: Path, records: int, name: str) -> Path:
    """A copy of the run's database holding only its first ``records`` tuning records."""
    out = run_dir / name
    out.mkdir(exist_ok=True)
    shutil.copyfile(run_dir / DB / WORKLOAD_FILE, out / WORKLOAD_FILE)
    with (run_dir / DB / RECORD_FILE).open() as src, (out / RECORD_FILE).open("w") as dst:
        for i, line in enumerate(src):
            if i >= records:
                break
            dst.write(line)
    return out


def shipped_database(run_dir: Path, records: int, name: str) -> Path:
    """The database the run's library by ``records`` compiles from, as ``gradtune tune``
    ships it: the run's confirmed winners (``gradtune.measure.confirm``) when they confirmed
    exactly those records, else the run's database cut there."""
    from gradtune.measure import confirm

    out = truncated_database(run_dir, records, name)
    if confirm.confirmed_database(run_dir / DB, records) is not None:
        for source, dest in ((confirm.WORKLOAD_FILE, WORKLOAD_FILE),
                             (confirm.RECORD_FILE, RECORD_FILE),
                             (confirm.ACCOUNT_FILE, confirm.ACCOUNT_FILE)):  # fmt: skip
            shutil.copyfile(run_dir / DB / source, out / dest)
    return out


def record_count(run_dir: Path) -> int:
    path = run_dir / DB / RECORD_FILE
    if not path.is_file():
        return 0
    with path.open() as f:
        return sum(1 for _ in f)


def builds_at_fractions(
    imported: Any, fused: Any, target: Any, run_dir: Path, rounds: list, budget: float
) -> dict[str, Any]:
    """Compile, verify and export the model as tuned by ¼, ½ and all of the budget."""
    out = {}
    for fraction in FRACTIONS:
        label = f"{round(fraction * 100)}"
        records = records_by(rounds, fraction * budget)
        entry: dict[str, Any] = {
            "fraction": fraction,
            "records": records,
            "estimated_us": estimate_by(rounds, fraction * budget),
        }
        start = time.perf_counter()
        try:
            database = shipped_database(run_dir, records, f"db_at_{label}")
            library = run_dir / f"model_at_{label}.so"
            entry["max_abs_err"] = api.build_verify_export(
                imported, fused, target, api.open_database(database), library
            )
            entry["library"] = library.name
        except Exception as err:  # a wrong schedule or a failed build: recorded, not fatal
            entry["error"] = f"{type(err).__name__}: {err}"[:2000]
        entry["compile_s"] = round(time.perf_counter() - start, 1)
        out[label] = entry
    return out


def run(spec: RunSpec, layout: Layout) -> dict[str, Any]:
    """Everything of one run; returns the result that becomes ``result.json``."""
    prepared = json.loads(layout.prepared(spec.model).read_text())
    config, target = api.host_target()
    pool = api.use_target_threads(config)  # as the CLI: the fleet it starts inherits it
    run_dir = layout.run_dir(spec)
    started = time.time()
    load_before = os.getloadavg()
    imported = api.import_model(MODELS[spec.model].tuning_file(layout.work))
    fused, tasks = api.partition_model(imported, target)
    per_round = spec.per_round or api.default_trials_per_round(len(tasks))
    weights = None
    if spec.searcher == "gradient":
        weights = Path(prepared["ensemble"] if layout.needs_ensemble() else prepared["weights"])
    scheduler = layout.scheduler_model()
    ensemble = Path(prepared["ensemble"]) if prepared.get("ensemble") else None
    with api.local_fleet() as tracker:
        tuned = tune_until_deadline(
            spec, tasks, target, tracker, layout.budget, run_dir, weights,
            layout.gradient_kwargs() if spec.searcher == "gradient" else None,
            measure=layout.measure,
            cost_model=api.scheduler_cost_model(scheduler, target.kind.name, ensemble),
            warmup=layout.warmup,
        )  # fmt: skip
    load_after = os.getloadavg()
    records = record_count(run_dir)
    return {
        "model": spec.model,
        "searcher": spec.searcher,
        "repeat": spec.repeat,
        "seed": spec.repeat,
        "run_id": spec.run_id,
        "per_round": per_round,
        "per_round_is_default": spec.per_round is None,
        "budget_s": layout.budget,
        "tasks": len(tasks),
        "target": config,
        "tvm_threads": pool,
        "cost_model": str(weights) if weights else "xgb (MetaSchedule default, from nothing)",
        # What the task scheduler (evolutionary search, the hybrid's explorer) scores with.
        "scheduler_cost_model": (
            "xgb (MetaSchedule default, from nothing)"
            if scheduler == "xgb"
            else f"{scheduler}: {ensemble}"
        ),
        "gradient_config": layout.gradient_config if spec.searcher == "gradient" else "",
        # The whole configuration, not only the overrides: defaults move between commits.
        "gradient_config_effective": (
            layout.gradient_effective() if spec.searcher == "gradient" else None
        ),
        **tuned,
        "records_in_db": records,
        # Every measured candidate, failed or not, is one record: the truncation relies on it.
        "records_match_trials": records == tuned["trials_total"],
        "trials_in_budget": records_by(tuned["rounds"], layout.budget),
        "builds": builds_at_fractions(
            imported, fused, target, run_dir, tuned["rounds"], layout.budget
        ),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "seconds_total": round(time.time() - started, 1),
        # The code that ran: a later --render names this, not the commit it renders at.
        "commit": git_commit(),
    }
