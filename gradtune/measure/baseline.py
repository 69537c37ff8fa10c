"""Every task's default schedule as its first measured record, so tuning never ships a regression.

A task's untuned program is its PrimFunc with no schedule applied: what ``relax.build``
compiles for a task the database knows nothing of. Searched programs are compared with it only
if it is in the database, so it is built and timed here by the run's own builder and runner
(the same evaluator, the same device, the same repeats as every candidate) and committed as a
record whose trace changes nothing. ``MetaScheduleApplyDatabase`` compiles each task's fastest
record; when nothing the search found beats the default (a concatenation, a pooling), the
default is what ships. Comparing against a local timing instead would pit two different
measurements against each other.

GPU targets are left out: an unscheduled GPU kernel binds no threads and cannot run, and their
untuned build is dlight's default schedule, applied at compile time outside MetaSchedule.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from ..partition import TuningTask
from ..target import is_gpu

log = logging.getLogger(__name__)


def workloads_of(database: Any, default: bool) -> set[int]:
    """Structural hashes of the workloads the database holds the default schedule of
    (``default``), or else a program besides it (searched, transferred)."""
    import tvm_ffi

    return {
        int(tvm_ffi.structural_hash(record.workload.mod))
        for record in database.get_all_tuning_records()
        if is_default(record) == default
    }


def default_schedule(mod: Any) -> Any:
    """The task's PrimFunc as it is, as a traced schedule MetaSchedule's database will use.

    MetaSchedule ignores a record whose trace has no instruction (``TuningRecord::IsValid``:
    such records never reach ``get_top_k`` or the compiler), so the trace holds one lookup of
    the root block, which changes nothing."""
    import tvm

    sch = tvm.s_tir.Schedule(mod)
    sch.get_sblock("root")
    return sch


def is_default(record: Any) -> bool:
    """Whether a tuning record is a task's default (unscheduled) program: its trace only
    looks blocks up."""
    return all(inst.kind.name.startswith("Get") for inst in record.trace.insts)


def measure_defaults(
    tasks: list[TuningTask], target: Any, database: Any, builder: Any, runner: Any
) -> int:
    """Build, time and commit the default schedule of every task that lacks one (a resumed
    run has them already); returns how many were measured. A default that fails to build or
    run is logged and left out: the task is still tuned, and compiles untuned only if
    nothing it measured works."""
    import tvm_ffi

    if is_gpu(target):
        return 0
    have = workloads_of(database, default=True)
    todo = [t for t in tasks if int(tvm_ffi.structural_hash(t.mod)) not in have]
    if not todo:
        return 0
    schedules = [default_schedule(t.mod) for t in todo]
    errors = measure_and_commit(todo, schedules, target, database, builder, runner)
    for task, error in zip(todo, errors, strict=True):
        if error is not None:
            log.warning("%s: the default schedule could not be measured (%s)", task.name, error)
    return sum(error is None for error in errors)


def measure_and_commit(
    tasks: list[TuningTask],
    schedules: list[Any],
    target: Any,
    database: Any,
    builder: Any,
    runner: Any,
) -> list[str | None]:
    """Build and time ``schedules[i]`` (a program of ``tasks[i]``) with the run's builder and
    runner, and commit each one that ran as a tuning record; returns, per schedule, None or
    the first line of why it could not be measured.

    The default schedules and transferred ones (``gradtune.transfer``) are measured here, as
    every searched candidate is: the same evaluator, device and repeats."""
    from tvm.s_tir import meta_schedule as ms

    if not schedules:
        return []
    built = builder.build([ms.builder.BuilderInput(s.mod, target) for s in schedules])
    args = [ms.arg_info.ArgInfo.from_prim_func(t.mod["main"]) for t in tasks]
    runnable = [i for i, b in enumerate(built) if b.error_msg is None]
    # The device is the (local or remote) CPU: GPU targets are not measured standalone.
    futures = runner.run(
        [ms.runner.RunnerInput(built[i].artifact_path, "cpu", args[i]) for i in runnable]
    )
    results = dict(zip(runnable, (f.result() for f in futures), strict=True))
    errors: list[str | None] = []
    for i, task in enumerate(tasks):
        error = built[i].error_msg or (results[i].error_msg if i in results else None)
        if built[i].artifact_path:
            shutil.rmtree(Path(built[i].artifact_path).parent, ignore_errors=True)
        run_secs = results[i].run_secs if i in results else None
        if error is not None or not run_secs:
            errors.append((error or "no timing").strip().splitlines()[0][:200])
            continue
        database.commit_tuning_record(
            ms.database.TuningRecord(
                trace=schedules[i].trace,
                workload=database.commit_workload(task.mod),
                run_secs=run_secs,
                target=target,
                args_info=args[i],
            )
        )
        errors.append(None)
    return errors


def kept_defaults(database: Any, tasks: list[TuningTask]) -> list[str]:
    """Tasks whose fastest record is still their default schedule: they compile untuned."""
    kept = []
    for task in tasks:
        if database.has_workload(task.mod):
            top = database.get_top_k(database.commit_workload(task.mod), 1)
            if top and is_default(top[0]):
                kept.append(task.name)
    return kept
