"""Confirm each task's winner quietly before it ships: the winner's curse of a noisy search.

A search keeps, per task, the program with the lowest recorded latency. Recorded latencies
carry noise, and the minimum over hundreds of noisy measurements favours the luckiest, not the
fastest. Measured on an Intel Xeon (Emerald Rapids, 2 cores) after 480 s runs of a
SqueezeNet-style CNN: re-timing each task's 5 fastest records quietly, the recorded best was
the quiet best in only 3 of 9 tasks of a gradient run; on the two largest convolutions it was
15% and 27% slower than the quiet best, and over all tasks the quiet bests summed to 192 µs
against 225 µs for the recorded ones. End to end, though, the confirmed libraries were within a
few percent of the recorded bests' (``bench/confirm_replay.py``), so ``tune`` confirms only
when asked. (Those runs timed each batch while the next one was searched for and built on the
same cores; the local fleet now measures alone, ``search.scheduler``, which leaves less noise
to confirm.)

So after the search each task's ``top_k`` fastest distinct records (and its default schedule
unless it was recorded over twice as slow, so that no regression ships on a noisy draw
either) are built once and timed ``rounds`` times
each with the run's runner, in rotation (drift hits every candidate alike), with nothing
else running; the task ships the one with the lowest median. The run's database keeps every
measurement the search made, in TVM's format (what a resumed run and the schedule library
read). The winners, with their quiet timings as ``run_secs``, go to a second JSONDatabase
(``confirmed_workload.json``, ``confirmed_tuning_record.json``), one record per task, which is
what compiles. ``confirmed.json`` says per task what was compared, and the record count of the
run's database it was confirmed at: a database that has grown since (a resumed run stopped
before confirming) is compiled as it is, not with a stale confirmation.

Tasks are confirmed largest first (weight × recorded latency), so a deadline that cuts the
confirmation short leaves the small ones with their recorded best.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..partition import TuningTask
from ..target import is_gpu
from .baseline import is_default
from .latency import median_seconds

log = logging.getLogger(__name__)

WORKLOAD_FILE = "confirmed_workload.json"
RECORD_FILE = "confirmed_tuning_record.json"
ACCOUNT_FILE = "confirmed.json"
DEFAULT_WITHIN = 2.0


@dataclass
class TaskConfirmation:
    """One task's comparison: the candidates' recorded and quiet latencies (µs), in the
    order of their recorded latency; ``winner`` indexes them."""

    task: str
    recorded_us: list[float]
    quiet_us: list[float | None]  # None: it did not build or run
    winner: int
    default: int | None  # which candidate is the default schedule, if it was compared

    @property
    def changed(self) -> bool:
        """Whether the quiet winner is not the search's recorded best."""
        return self.winner != 0


@dataclass
class Confirmation:
    """What a confirmation compared and chose (``confirmed.json``)."""

    records_at: int = 0  # the run database's record count it confirmed
    seconds: float = 0.0
    tasks: list[TaskConfirmation] = field(default_factory=list)
    unconfirmed: list[str] = field(default_factory=list)  # cut by the deadline or a stop

    @property
    def changed(self) -> int:
        return sum(t.changed for t in self.tasks)

    def summary(self) -> dict[str, Any]:
        """The totals ``summary.json`` and MLflow get."""
        return {
            "confirmed_tasks": len(self.tasks),
            "confirmed_changed": self.changed,
            "confirm_seconds": round(self.seconds, 2),
        }


def confirm(
    tasks: list[TuningTask],
    target: Any,
    database: Any,
    builder: Any,
    runner: Any,
    out_dir: Path,
    top_k: int = 4,
    rounds: int = 3,
    deadline: float | None = None,
    stop: Any = None,
) -> Confirmation:
    """Re-time each task's ``top_k`` fastest records (and its default) ``rounds`` times in
    rotation and write the winners to ``out_dir``'s confirmed database.

    ``deadline`` (``time.perf_counter()`` seconds) and ``stop`` (a ``StopSignal``) end it
    between tasks; a task is not started when the previous one's time would overrun the
    deadline. Tasks not confirmed keep their recorded best in the confirmed database."""
    start = time.perf_counter()
    result = Confirmation(records_at=len(database))
    picks: dict[str, Any] = {}  # task name -> the record that ships
    found = {t.name: _candidates(database, t, top_k) for t in tasks if database.has_workload(t.mod)}
    # Largest first (weight × recorded best): a deadline cuts the tasks that matter least.
    order = sorted(
        (t for t in tasks if found.get(t.name)),
        key=lambda t: -t.weight * median_seconds(found[t.name][0].run_secs),
    )
    last_s = 0.0
    for task in order:
        candidates = found[task.name]
        picks[task.name] = candidates[0]
        now = time.perf_counter()
        cut = deadline is not None and now + last_s > deadline
        if len(candidates) < 2 or cut or (stop is not None and stop.stopped):
            if len(candidates) >= 2:
                result.unconfirmed.append(task.name)
            continue
        done = _retime(task, candidates, target, builder, runner, rounds)
        last_s = time.perf_counter() - now
        if done is None:
            result.unconfirmed.append(task.name)
            continue
        record, account = done
        picks[task.name] = record
        result.tasks.append(account)
        log.info(
            "%s: quiet %s µs (recorded %s); ships #%d",
            task.name, _fmt(account.quiet_us), _fmt(account.recorded_us), account.winner,
        )  # fmt: skip
    result.seconds = time.perf_counter() - start
    _write(out_dir, picks, result)
    return result


def _candidates(database: Any, task: TuningTask, top_k: int) -> list[Any]:
    """The task's ``top_k`` fastest distinct programs (by TVM's mean), then its default
    schedule when it is not among them."""
    workload = database.commit_workload(task.mod)
    # Enough to find top_k distinct traces and the default among them or behind them.
    records = database.get_top_k(workload, 100000)
    picked, seen, default = [], set(), None
    for record in records:
        text = str(record.trace)
        if text in seen:
            continue
        seen.add(text)
        if len(picked) < top_k:
            picked.append(record)
        elif default is None and is_default(record):
            default = record
        if len(picked) >= top_k and (default is not None or any(map(is_default, picked))):
            break
    # A default recorded over DEFAULT_WITHIN × the best cannot win on a quiet re-timing (the
    # largest inflation seen on a recorded best was 1.8×): not worth its build and timing.
    best = median_seconds(picked[0].run_secs) if picked else math.inf
    if default is not None and median_seconds(default.run_secs) <= DEFAULT_WITHIN * best:
        picked.append(default)
    return picked


def _retime(
    task: TuningTask, records: list[Any], target: Any, builder: Any, runner: Any, rounds: int
) -> tuple[Any, TaskConfirmation] | None:
    """Build ``records`` once, time them ``rounds`` times in rotation; the fastest by median
    with its quiet samples as a new record, and the account. None if fewer than two ran."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    mods = []
    for record in records:
        sch = tvm.s_tir.Schedule(task.mod)
        record.trace.apply_to_schedule(sch, remove_postproc=False)
        mods.append(sch.mod)
    built = builder.build([ms.builder.BuilderInput(m, target) for m in mods])
    try:
        ok = [i for i, b in enumerate(built) if b.error_msg is None]
        if len(ok) < 2:
            return None
        device = "cuda" if is_gpu(target) else "cpu"
        args = ms.arg_info.ArgInfo.from_prim_func(task.mod["main"])
        # The runner's own values (TVM's FloatImm), which the record keeps as they are.
        samples: dict[int, list[Any]] = {i: [] for i in ok}
        for r in range(rounds):
            turn = ok[r % len(ok) :] + ok[: r % len(ok)]
            inputs = [ms.runner.RunnerInput(built[i].artifact_path, device, args) for i in turn]
            for i, future in zip(turn, runner.run(inputs), strict=True):
                res = future.result()
                if res.error_msg is None and res.run_secs:
                    samples[i].extend(res.run_secs)
    finally:
        for b in built:
            if b.artifact_path:
                shutil.rmtree(Path(b.artifact_path).parent, ignore_errors=True)
    ran = [i for i in ok if samples[i]]
    if len(ran) < 2:
        return None
    quiet = {i: median_seconds(samples[i]) for i in ran}
    winner = min(ran, key=lambda i: quiet[i])
    chosen = records[winner]
    record = ms.database.TuningRecord(
        trace=chosen.trace,
        workload=chosen.workload,
        run_secs=samples[winner],
        target=chosen.target,
        args_info=chosen.args_info,
    )
    account = TaskConfirmation(
        task=task.name,
        recorded_us=[round(1e6 * median_seconds(r.run_secs), 3) for r in records],
        quiet_us=[round(1e6 * quiet[i], 3) if i in quiet else None for i in range(len(records))],
        winner=winner,
        default=next((i for i, r in enumerate(records) if is_default(r)), None),
    )
    return record, account


def _write(out_dir: Path, picks: dict[str, Any], result: Confirmation) -> None:
    """The confirmed database and its account, written beside and then moved into place, so
    that a crash leaves the old confirmation or the new one, never half of one."""
    from tvm.s_tir import meta_schedule as ms

    staging = out_dir / ".confirming"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    db = ms.database.JSONDatabase(
        path_workload=str(staging / WORKLOAD_FILE),
        path_tuning_record=str(staging / RECORD_FILE),
        allow_missing=True,
        module_equality="structural",
    )
    for record in picks.values():
        workload = db.commit_workload(record.workload.mod)
        db.commit_tuning_record(
            ms.database.TuningRecord(
                trace=record.trace,
                workload=workload,
                run_secs=record.run_secs,
                target=record.target,
                args_info=record.args_info,
            )
        )
    account = {
        "records_at": result.records_at,
        "seconds": round(result.seconds, 2),
        "tasks": [asdict(t) for t in result.tasks],
        "unconfirmed": result.unconfirmed,
    }
    (staging / ACCOUNT_FILE).write_text(json.dumps(account, indent=1) + "\n")
    # The account last: it is what says the confirmed database is whole.
    (out_dir / ACCOUNT_FILE).unlink(missing_ok=True)
    for name in (WORKLOAD_FILE, RECORD_FILE, ACCOUNT_FILE):
        (staging / name).replace(out_dir / name)
    staging.rmdir()


def confirmed_database(out_dir: Path, records: int) -> Any | None:
    """The confirmed database of ``out_dir``, if there is one and it confirmed the run's
    database at ``records`` records (later records would be ignored by it); else None."""
    from tvm.s_tir import meta_schedule as ms

    account = out_dir / ACCOUNT_FILE
    if not account.is_file():
        return None
    try:
        at = json.loads(account.read_text())["records_at"]
    except (ValueError, KeyError):
        return None
    if at != records:
        return None
    return ms.database.JSONDatabase(
        path_workload=str(out_dir / WORKLOAD_FILE),
        path_tuning_record=str(out_dir / RECORD_FILE),
        allow_missing=False,
        module_equality="structural",
    )


def _fmt(values: list[float | None]) -> str:
    return "/".join("-" if v is None else f"{v:.1f}" for v in values)
