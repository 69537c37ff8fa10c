"""Tune the tasks with MetaSchedule's task scheduler, recording every measured batch.

The search strategy is the plug-in point: gradtune's gradient search (the default) or one of
MetaSchedule's own by name, always a ``ReportingStrategy``; builder, RPC runner and
JSONDatabase are MetaSchedule's, and so is the task scheduler's policy (``search/scheduler.py``
joins each batch once measured and keeps the time budget). The loop hands the strategy the run's
``Session`` (``search/session.py``): the stop signal that ends the run between rounds (time
budget, Ctrl-C), and the place where the strategy's account of each batch meets the loop's
measure callback, which writes the batch's one ``RoundLog``.

SIGINT and SIGTERM set that stop signal too (``stop.defer_signals``) and are handed on once
the scheduler has returned: raised inside one of the Python callbacks TVM calls, they would be
swallowed or crash the process. The database is repaired before it is opened
(``database_repair``): a run killed mid-append leaves a line that TVM cannot read.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .database_repair import repair_database
from .errors import GradtuneError
from .measure.adaptive import MeasureCost, TaskBests, prim_func_signature
from .measure.baseline import kept_defaults, measure_defaults, workloads_of
from .measure.builder import make_builder
from .measure.confirm import Confirmation, confirm, confirmed_database
from .measure.latency import median_seconds, result_seconds
from .measure.rpc_fleet import Tracker, is_loopback
from .measure.rpc_session import DeviceWatch
from .measure.runner import MeasureSettings, make_rpc_runner
from .partition import TuningTask
from .search import SEARCH_STRATEGIES, WARMUPS, make_strategy
from .search.scheduler import GradientTaskScheduler
from .search.session import ReportingStrategy, RoundLog, RunSummary, Session
from .stop import StopSignal, defer_signals
from .tune_logs import task_loggers
from .tvm_compat import register_tensor_intrinsics

log = logging.getLogger(__name__)


@dataclass
class TuneResult:
    """What a tuning run measured: its batches in order, trial counts and best latencies."""

    rounds: list[RoundLog] = field(default_factory=list)
    trials: int = 0
    resumed_trials: int = 0
    seconds: float = 0.0
    best_us: dict[str, float] = field(default_factory=dict)  # per task
    stopped_by_time_budget: bool = False
    search_summary: RunSummary | None = None  # the gradient search's run totals
    # Every GradientConfig field the gradient search ran with, defaults included: they move
    # between commits (structural_variants went from 0 to 3), and a result names its search.
    search_config: dict[str, Any] | None = None
    default_kept: list[str] = field(default_factory=list)  # tasks no searched program beat
    measure_cost: MeasureCost = field(default_factory=MeasureCost)  # device time spent timing
    transfer: Any = None  # transfer.run.TransferStats of a transfer or warm start
    # Tasks whose warm-up batch the task scheduler skipped (``start_warmup``): with
    # warm-up ``skip``, every one with a working program.
    warmup_skipped: list[str] = field(default_factory=list)
    warmup: str = "model"  # the task scheduler's warm-up (``start_warmup``)
    confirmation: Confirmation | None = None  # the quiet re-timing of each task's few best


def start_warmup(
    scheduler: GradientTaskScheduler,
    tasks: list[TuningTask],
    best_us: dict[str, float],
    warmup: str,
    held: frozenset[str] = frozenset(),
) -> list[str]:
    """Set the task scheduler's warm-up (``search.WARMUPS``) from each task's best latency
    measured before the search: its default schedule's, and after a warm start the
    transferred ones'. ``held``: the tasks the database held programs of (transferred,
    or a resumed run's), which ``fresh`` visits after the others. Returns the tasks whose
    warm-up batch is skipped.

    ``stake`` keeps a batch for every task and orders them by weight × latency; it is the
    default after a warm start, whose transferred programs say where the latency is. With the
    model's order, warm starts on an Intel Xeon reached cold tuning's final estimate only 1.39x
    sooner: a 3.3 ms convolution may wait behind sub-µs tasks. ``skip`` hands every measured
    task's latency to the scheduler as its first batch (``GradientTaskScheduler.seed``), so
    the gradient policy picks, the most at stake first, from the first round; a task with no
    working program still gets its batch. On a 2-core Zen 2 (one warm run per model,
    ``bench/results/transfer_tuning_znver2_warmup_stake.md``) warm starts skipping it were
    6-48x ahead of cold tuning at 60 s, but the policy spent the budget on the 3-7 largest
    tasks and never searched the small ones: cold tuning's final estimate came 1.20x sooner
    (geomean), against 1.56x with ``stake``."""
    if warmup not in WARMUPS:
        raise ValueError(f"unknown warm-up {warmup!r}")
    # A measured task's share of the model's estimated latency; the others have none.
    shares = latency_shares(tasks, best_us)
    measured = [(i, task) for i, task in enumerate(tasks) if task.name in shares]
    if warmup in ("stake", "fresh"):
        fresh = (i for i, task in enumerate(tasks) if task.name not in held)
        first = frozenset(fresh) if warmup == "fresh" else frozenset()
        scheduler.order_warmup({i: shares[task.name] for i, task in measured}, first)
    if warmup != "skip":
        return []
    for i, task in measured:
        scheduler.seed(i, best_us[task.name] / 1e3)
    return [task.name for _, task in measured]


def run_database(work_dir: Path):
    """The JSONDatabase a tuning run in ``work_dir`` writes (and resumes from), repaired
    first if a crash left it torn."""
    from tvm.s_tir import meta_schedule as ms

    path_workload = work_dir / "database_workload.json"
    path_tuning_record = work_dir / "database_tuning_record.json"
    repair_database(path_workload, path_tuning_record)
    return ms.database.JSONDatabase(
        path_workload=str(path_workload),
        path_tuning_record=str(path_tuning_record),
        allow_missing=True,
        module_equality="structural",
    )


def compile_database(work_dir: Path):
    """The database a tuning run in ``work_dir`` compiles with: its confirmed winners
    (``measure.confirm``) when they confirm the database as it stands, else the database."""
    database = run_database(work_dir)
    return confirmed_database(work_dir, len(database)) or database


def best_from_database(database, tasks: list[TuningTask]) -> dict[str, float]:
    """Best measured latency (µs) per task already in the database."""
    best = {}
    for task in tasks:
        if not database.has_workload(task.mod):
            continue
        top = database.get_top_k(database.commit_workload(task.mod), 1)
        if top and top[0].run_secs:
            best[task.name] = 1e6 * median_seconds(top[0].run_secs)
    return best


def searched_tasks(database, tasks: list[TuningTask]) -> frozenset[str]:
    """The tasks the database holds a program of other than the default schedule
    (``measure.baseline``): transferred, or measured by an earlier run this one resumes."""
    import tvm_ffi

    searched = workloads_of(database, default=False)
    return frozenset(t.name for t in tasks if int(tvm_ffi.structural_hash(t.mod)) in searched)


def count_records(database) -> int:
    """Trials already measured, failed ones included: the resume bookkeeping.

    An output directory belongs to one model (``job.check_out_dir``), so every record is one
    of its tasks'. ``get_top_k`` would undercount: it skips failed runs.
    """
    return len(database)


def _make_progress_callback(
    tasks: list[TuningTask],
    best_us: dict[str, float],
    result: TuneResult,
    start: float,
    time_budget: float | None,
    on_round: Callable[[RoundLog], None] | None,
    session: Session,
):
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms

    @derived_object
    class ProgressCallback(ms.measure_callback.PyMeasureCallback):
        """Records best-so-far after every batch; enforces the wall-clock budget."""

        def apply(
            self, task_scheduler, task_id, measure_candidates, builder_results, runner_results
        ):
            task = tasks[task_id]
            batch = [1e6 * result_seconds(r) for r in runner_results]
            batch_best = min(batch, default=math.inf)
            if batch_best < best_us.get(task.name, math.inf):
                best_us[task.name] = batch_best
            result.trials += len(measure_candidates)
            record = RoundLog(
                round=len(result.rounds) + 1,
                task=task.name,
                measured=len(measure_candidates),
                trials=result.trials,
                seconds=time.perf_counter() - start,
                batch_best_us=batch_best,
                task_best_us=best_us.get(task.name, math.inf),
                estimated_model_us=estimate_model_us(tasks, best_us),
                # MetaSchedule notified the strategy of this batch just before this callback.
                search=session.take(task.name),
            )
            result.rounds.append(record)
            # Without a terminal the progress bar stays silent until the end; a Prefect worker's
            # run logs (flow_logging) show the tuning's progress by these lines.
            log.info(
                "round %d: %s, %d candidates (best %.1f µs); %d trials in %.0f s; "
                "kernels ≈ %.3f ms",
                record.round, task.name, record.measured, batch_best, record.trials,
                record.seconds, record.estimated_model_us / 1e3,
            )  # fmt: skip
            failed = sum(not math.isfinite(us) for us in batch)
            # An empty batch (a trivial design space, all of it measured) is not a failure.
            if runner_results and failed == len(runner_results):
                first = next(
                    (
                        r.error_msg
                        for r in list(builder_results) + list(runner_results)
                        if r.error_msg
                    ),
                    "unknown",
                )
                log.warning("every candidate of %s failed; first error: %s", task.name, first[:500])
            if on_round is not None:
                on_round(record)
            if time_budget is not None and record.seconds >= time_budget:
                result.stopped_by_time_budget = True
                # Every strategy now answers "no more candidates", so the scheduler terminates
                # each task itself and joins what is in flight (see search/stoppable.py).
                session.stop.set()

    return ProgressCallback()


def _log_batch(
    result: TuneResult,
    tasks: list[TuningTask],
    best_us: dict[str, float],
    database: Any,
    measured: int,
    start: float,
    on_round: Callable[[RoundLog], None] | None = None,
) -> None:
    """The transferred programs as one round of the curve (a batch before the search's),
    reported to ``on_round`` like every batch of the search."""
    before = dict(best_us)
    best_us.update(best_from_database(database, tasks))
    improved = [us for name, us in best_us.items() if us < before.get(name, math.inf)]
    result.rounds.append(
        RoundLog(
            round=len(result.rounds) + 1,
            task="transfer",
            measured=measured,
            trials=result.trials,
            seconds=time.perf_counter() - start,
            batch_best_us=min(improved, default=math.inf),
            task_best_us=min(improved, default=math.inf),
            estimated_model_us=estimate_model_us(tasks, best_us),
            search=None,
        )
    )
    if on_round is not None:
        on_round(result.rounds[-1])


def estimate_model_us(tasks: list[TuningTask], best_us: dict[str, float]) -> float:
    """Σ weight × (best tuned or else untuned) per-call latency: the kernels' share of a run."""
    total = 0.0
    for task in tasks:
        us = min(best_us.get(task.name, math.inf), task.untuned_us)
        if math.isfinite(us):
            total += task.weight * us
    return total


def latency_shares(tasks: list[TuningTask], best_us: dict[str, float]) -> dict[str, float]:
    """Each measured task's share of Σ weight × best µs over the measured tasks."""
    costs = {
        t.name: t.weight * best_us[t.name]
        for t in tasks
        if math.isfinite(best_us.get(t.name, math.inf))
    }
    total = sum(costs.values())
    return {name: cost / total for name, cost in costs.items()} if total > 0 else {}


def default_trials_per_round(budget: int, num_tasks: int) -> int:
    """Batch size giving every task its warm-up round and, budget permitting, a few more.

    Trials are exact when the batch divides the budget; otherwise the last batch overshoots.

    MetaSchedule's gradient scheduler warms each task up once before choosing by gradient;
    with a batch too large for the budget, later tasks are never tuned at all.
    """
    size = max(2, min(32, budget // max(1, 2 * num_tasks)))
    # MetaSchedule sends whole batches until the budget is reached, so a batch size that does
    # not divide it overshoots (128 in batches of 10 measures 130). Prefer a nearby divisor.
    for candidate in range(size, max(1, size // 2), -1):
        if budget % candidate == 0:
            return candidate
    return size


def tune(
    tasks: list[TuningTask],
    target: Any,
    work_dir: Path,
    tracker: Tracker,
    max_trials: int,
    time_budget: float | None = None,
    search: str | ReportingStrategy | None = "gradient",
    trials_per_round: int | None = None,
    num_rpc_workers: int = 1,
    measure: MeasureSettings | None = None,
    seed: int = 0,
    on_start: Callable[[int], None] | None = None,
    on_round: Callable[[RoundLog], None] | None = None,
    tracking_uri: str | None = None,
    warm_start: Callable[[Any, Any, Any, int], int] | None = None,
    cost_model: str | Any = "xgb",
    confirm_top_k: int = 0,
    confirm_share: float = 0.1,
    exclusive_measurement: bool | None = None,
    warmup: str | None = None,
) -> TuneResult:
    """Tune ``tasks`` until ``max_trials`` measured trials (counting earlier, resumed ones).

    ``search``: a strategy name (``SEARCH_STRATEGIES``) or a strategy object; wrap one of
    MetaSchedule's objects in ``search.stoppable.Stoppable``. ``on_start`` gets the number of
    trials already in the database, ``on_round`` each batch. ``tracking_uri``: the MLflow
    registry the gradient search takes its cost model from (when ``search`` is a name).

    ``warm_start(database, builder, runner, trials_left)`` (``transfer.run.Transfer``) measures
    programs into the database after the default schedules and before the search, which then
    starts from them; it returns how many it measured. ``search`` None: no search at all (a
    transfer-only run), and ``max_trials`` bounds nothing but what ``warm_start`` may measure.

    ``cost_model``: the task scheduler's, which MetaSchedule's evolutionary search (and the
    gradient search's evolutionary explorer) score candidates with: MetaSchedule's XGBoost,
    trained from nothing, by default. Any ``PyCostModel`` goes there too; AdaTune's ensemble
    (``OnlineCostModel.ensemble()``) is an ablation of ``bench/adatune_ablation.py``. It must
    not be the gradient search's own cost model object, which would then learn every batch
    twice.

    ``confirm_top_k``: after the search, each task's that many fastest records (and its default
    schedule) are timed again, quietly and in rotation, and the fastest ships
    (``measure.confirm``; 0, the default: the recorded best ships). With a ``time_budget`` the
    search stops at ``1 - confirm_share`` of it, leaving the rest to the confirmation.

    ``exclusive_measurement``: measure every batch alone, with no search or build of the next
    one beside it (``GradientTaskScheduler``'s ``exclusive``). None, the default: when the
    tracker is on loopback, whose devices share this host's cores.

    ``warmup``: how the task scheduler's first batches go round (``start_warmup``): ``model``
    (MetaSchedule's), ``stake`` or ``skip``. None, the default: ``stake`` after a warm start,
    else ``model``.
    """
    import psutil
    from tvm.s_tir import meta_schedule as ms

    if max_trials <= 0:
        raise GradtuneError(f"trial budget must be positive, got {max_trials}")
    if confirm_top_k < 0 or not 0 <= confirm_share < 1:
        raise GradtuneError(
            f"confirmation needs top_k >= 0 and a share in [0, 1), not {confirm_top_k} and "
            f"{confirm_share}"
        )
    if search is None and warm_start is None:
        raise GradtuneError("no search and nothing to transfer: nothing to tune")
    if warmup is None:
        warmup = "model" if warm_start is None else "stake"
    if warmup not in WARMUPS:
        raise GradtuneError(f"unknown warm-up {warmup!r}; choose one of {', '.join(WARMUPS)}")
    if isinstance(search, str) and search not in SEARCH_STRATEGIES:
        raise GradtuneError(
            f"unknown search {search!r}; choose one of {', '.join(SEARCH_STRATEGIES)}"
        )
    work_dir.mkdir(parents=True, exist_ok=True)
    database = run_database(work_dir)
    result = TuneResult(warmup=warmup)
    result.resumed_trials = count_records(database)
    if on_start is not None:
        on_start(result.resumed_trials)
    best_us = best_from_database(database, tasks)
    result.best_us = best_us
    remaining = max_trials - result.resumed_trials
    if search is None:  # a transfer: every candidate it has, however many were measured before
        remaining = max_trials
    if remaining <= 0:
        log.info("database already holds %d trials: nothing left to tune", result.resumed_trials)
        return result

    if trials_per_round is None:
        trials_per_round = default_trials_per_round(remaining, len(tasks))
    register_tensor_intrinsics(target.kind.name)
    cores = int(target.attrs.get("num-cores", 0) or psutil.cpu_count(logical=False) or 1)
    # MetaSchedule's per-task logs go to work_dir/logs; on the console only its warnings, not
    # the statistics table of every round, which would drown the progress bar.
    loggers = task_loggers(work_dir, [t.name for t in tasks])
    # One strategy object for the run: each TuneContext clones it, and the clones share the
    # session (and the gradient search's online cost model, so what one task measures teaches
    # the search of the others).
    strategy = (
        make_strategy(search, target.kind.name, tracking_uri=tracking_uri)
        if isinstance(search, str)
        else search
    )
    if strategy is not None and cost_model is getattr(strategy, "cost_model", None):
        raise GradtuneError(
            "the task scheduler's cost model is the gradient search's own object: give it a "
            "separate one"
        )
    session = Session()
    if strategy is not None:
        strategy.attach(session)
    contexts = [
        ms.TuneContext(
            mod=task.mod,
            target=target,
            space_generator="post-order-apply",
            search_strategy=strategy,
            task_name=task.name,
            logger=loggers[i],
            rand_state=seed + i,
            num_threads=cores,
        ).clone()
        for i, task in enumerate(tasks)
    ] if strategy is not None else []  # fmt: skip
    start = time.perf_counter()
    # The search's share of the budget; the confirmation has the rest.
    search_budget = time_budget
    if time_budget is not None and confirm_top_k > 0:
        search_budget = time_budget * (1 - confirm_share)
    if search_budget is not None:
        session.deadline = start + search_budget
    # The task scheduler keeps the deadline between batches; a generation under way
    # (MetaSchedule's evolution: tens of seconds on a large task) learns of it from the stop.
    timer = threading.Timer(search_budget or 0, session.stop.set)
    timer.daemon = True
    devices = DeviceWatch(session.stop)
    if exclusive_measurement is None:
        exclusive_measurement = is_loopback(str(tracker.host))
    scheduler = GradientTaskScheduler(
        seed=seed, deadline=session.deadline, exclusive=exclusive_measurement
    )
    callbacks = [
        *ms.measure_callback.MeasureCallback.create("default"),
        _make_progress_callback(tasks, best_us, result, start, search_budget, on_round, session),
        devices,
        scheduler.feedback(),
    ]
    builder = make_builder(max_workers=cores)
    # The adaptive evaluator cuts a candidate far slower than its task's best so far.
    task_best = TaskBests({t.name: prim_func_signature(t.mod) for t in tasks}, best_us)
    runner = make_rpc_runner(
        tracker, measure or MeasureSettings(), max_workers=num_rpc_workers, task_best=task_best
    )
    try:
        if search_budget is not None:
            timer.start()
        with defer_signals(session.stop):
            # Measured like every candidate, each task's default schedule is what the search
            # must beat; the database then never hands the compiler a slower program.
            first = measure_defaults(tasks, target, database, builder, runner)
            result.trials += first
            if warm_start is not None and not session.stop.stopped:
                # A warm start leaves the search at least half of the budget.
                left = remaining - first
                transferred = warm_start(
                    database, builder, runner, left if strategy is None else left // 2
                )
                first += transferred
                result.trials += transferred
                _log_batch(result, tasks, best_us, database, transferred, start, on_round)
            session.trials_left = remaining - first
            best_us.update(best_from_database(database, tasks))
            session.latency_shares = latency_shares(tasks, best_us)
            if strategy is not None and remaining > first and not session.stop.stopped:
                # Only here: a run whose budget ended before the search skipped no warm-up.
                held = searched_tasks(database, tasks) if warmup == "fresh" else frozenset()
                result.warmup_skipped = start_warmup(scheduler, tasks, best_us, warmup, held)
                ms.tune_tasks(
                    tasks=contexts,
                    task_weights=[float(t.weight) for t in tasks],
                    work_dir=str(work_dir),
                    max_trials_global=remaining - first,
                    num_trials_per_iter=trials_per_round,
                    builder=builder,
                    runner=runner,
                    database=database,
                    cost_model=cost_model,
                    measure_callbacks=callbacks,
                    task_scheduler=scheduler,
                )
                result.stopped_by_time_budget |= scheduler.out_of_time
                if search_budget is not None:  # the timer may have stopped it
                    result.stopped_by_time_budget |= time.perf_counter() - start >= search_budget
        if confirm_top_k > 0:
            # A signal during the search has been handed on above; one now ends the
            # confirmation between tasks, the recorded bests standing for the rest.
            quiet = StopSignal()
            with defer_signals(quiet):
                result.confirmation = confirm(
                    tasks, target, database, builder, runner, work_dir, top_k=confirm_top_k,
                    deadline=None if time_budget is None else start + time_budget, stop=quiet,
                )  # fmt: skip
    finally:
        timer.cancel()
        runner.pool.shutdown()
        builder.shutdown()
    devices.raise_if_lost()
    result.seconds = time.perf_counter() - start
    result.search_summary = session.summary
    config = getattr(strategy, "config", None)  # a GradientConfig: only GradientSearch has one
    if config is not None:
        result.search_config = config.as_json()
    shipped = compile_database(work_dir) if result.confirmation is not None else database
    result.default_kept = kept_defaults(shipped, tasks)
    if result.confirmation is not None:
        for task in result.confirmation.tasks:  # what ships, as timed quietly
            best_us[task.task] = task.quiet_us[task.winner]
    result.measure_cost = cost = runner.cost()
    if cost.unconverged:
        log.warning(
            "%d of %d candidates were timed to the cap without their CV settling: a noisy device",
            cost.unconverged, cost.candidates,
        )  # fmt: skip
    return result
