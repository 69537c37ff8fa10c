"""Transferred schedules measured into a run's database: transfer-only tuning and warm start.

Both go through ``tune.tune``'s loop, which calls ``Transfer`` once its default schedules are
measured, with the run's builder, RPC runner and JSONDatabase: each candidate is built and
timed standalone like every searched one, and committed as a tuning record. Then

- ``gradtune transfer`` searches no further: the compiler takes each task's fastest record,
  which is the default schedule wherever no transferred one beat it (the task stays untuned);
- ``gradtune tune --warm-start`` searches on, and the search finds them in the database: the
  gradient search seeds its descent from a task's fastest records and fine-tunes its cost
  model on them before its first batch (``GradientSearch._load_measured``); MetaSchedule's
  evolutionary search starts its population from the database's best.

A resumed run measures no candidate twice: one whose program the database already holds for
its workload is counted as tried and left alone.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import GradtuneError
from ..partition import DEFAULT_LOWERING, SHAPING_OPTIONS, TuningTask, recorded_lowering
from .apply import ADAPTED, APPLIED, FAILED, Candidate, DesignSpace, candidates_for
from .library import Library, Source, target_key
from .selection import rank_sources, ranking_lines

log = logging.getLogger(__name__)

AUTO = "auto"
# Every source of the library at once: a task's candidates are the nearest in shape of all
# the library's schedules of its class, not only those of the model Eq. 1 chose.
ALL = "all"
CANDIDATES_PER_TASK = 16  # the paper tries every compatible schedule; a source rarely has more


@dataclass
class TransferStats:
    """What a transfer tried and what it kept (``summary.json`` quotes it)."""

    source: str | None
    ranking: list[str] = field(default_factory=list)  # the Eq. 1 ranking as printed
    candidates_tried: int = 0  # measured now, or found already measured on resume
    candidates_invalid: int = 0  # could not be applied, built or run
    applied: int = 0  # decisions used as the source had them
    adapted: int = 0  # tile (or other) decisions fitted to the new extents
    failed: int = 0  # no program: no matching sketch, or TVM / a postprocessor refused it
    measured: int = 0  # trials this run spent on transferred candidates
    transferred_tasks: list[str] = field(default_factory=list)  # fastest record transferred
    seconds: float = 0.0


def library_spec(job: Any) -> str:
    """The SPEC a job reads its library from: ``--from`` when it names a source, which is
    then the whole library; ``--library`` / ``--warm-start`` otherwise."""
    return job.library if job.library_from in (None, AUTO, ALL) else job.library_from


def source_choice(job: Any) -> str:
    """What ``select_source`` chooses by for a job: ``all`` sources or Eq. 1 (``auto``, also
    over a library of the one source ``--from`` named). Unasked, a warm start takes every
    source and a transfer Eq. 1's, the paper's method. On a 2-core Zen 2 (one run per model,
    ``bench/results/transfer_tuning_znver2_from_all.md``) warm starts from every source
    reached cold tuning's final estimate 3.68x sooner (geomean of 5 models), from Eq. 1's
    1.56x; their transfer measured more candidates (48-59 s of 480 against 7-25 s), which a
    search's budget affords and a transfer's few seconds were chosen not to spend."""
    if job.library_from is None:
        return AUTO if job.transfer_only else ALL
    return ALL if job.library_from == ALL else AUTO


def library_uri(job: Any) -> str | None:
    """The registry a library's ``registry`` and ``NAME@ALIAS`` are read from: the job's
    ``--mlflow-uri``, else ``MLFLOW_TRACKING_URI``."""
    import os

    return job.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI")


def select_source(
    tasks: list[TuningTask],
    library: Library,
    target: Any,
    choice: str = AUTO,
    lowering: dict[str, Any] | None = None,
) -> tuple[Source | None, list[str]]:
    """The source to transfer from and the lines to print: by Eq. 1 (``choice`` "auto"), the
    library's source named ``choice``, or (``choice`` "all") every source as one, their
    schedules together. None (with a notice) when no source has a schedule of any of the
    model's kernel classes, or when the library is empty (the last line then says why).
    Raises for a library of another target only.

    Only schedules tuned under this run's ``lowering`` of their loops are ranked and offered
    (``Source.fitting``; None: the default lowering), as only this target's are."""
    if library.is_empty():
        return None, [library.empty_reason()]
    run_lowering = recorded_lowering(lowering or asdict(DEFAULT_LOWERING))
    found = library.check_target(target_key(target))
    sources = [s.fitting(run_lowering) for s in found]
    left_out = sum(len(s.schedules) for s in found) - sum(len(s.schedules) for s in sources)
    ranked = rank_sources(tasks, sources)
    lines = ranking_lines(tasks, ranked)
    if left_out:
        lines.insert(
            0,
            f"{left_out} schedule(s) tuned under another lowering of their loops left out "
            f"({', '.join(SHAPING_OPTIONS)})",
        )
    if choice == ALL:
        merged = [s for r in ranked if r.score > 0 for s in r.source.schedules]
        best = rank_sources(tasks, [Source(ALL, ranked[0].source.target, merged)])[0]
        named = [r.source.name for r in ranked if r.score > 0]
        if best.score > 0:
            lines.append(f"transferring from all {len(named)}: {', '.join(named)}")
            return best.source, lines
    elif choice == AUTO:
        best = ranked[0]
    else:
        named = [r for r in ranked if r.source.name == choice]
        if not named:
            names = ", ".join(r.source.name for r in ranked)
            raise GradtuneError(f"--from {choice!r} is not in the library ({names})")
        best = named[0]
    if best.score <= 0:
        lines.append(
            f"no source has a schedule of this model's kernel classes "
            f"({', '.join(sorted({t.kernel_class for t in tasks}))}): nothing to transfer"
        )
        return None, lines
    lines.append(f"transferring from {best.source.name}")
    return best.source, lines


class Transfer:
    """Measure the source's schedules on every task into the run's database (``tune.tune``'s
    ``warm_start`` hook); ``stats`` says what happened."""

    def __init__(
        self,
        tasks: list[TuningTask],
        target: Any,
        source: Source | None,
        ranking: list[str] | None = None,
        per_task: int = CANDIDATES_PER_TASK,
    ) -> None:
        self.tasks = tasks
        self.target = target
        self.source = source
        self.per_task = per_task
        self.stats = TransferStats(source=source.name if source else None, ranking=ranking or [])

    def __call__(self, database: Any, builder: Any, runner: Any, trials_left: int) -> int:
        """Measure up to ``trials_left`` candidates (round-robin over tasks, each task's
        source-fastest first); returns how many were measured."""
        from ..measure.baseline import measure_and_commit

        start = time.perf_counter()
        stats = self.stats
        if self.source is None:
            return 0
        known = measured_programs(database)
        already = 0  # measured by an earlier attempt of this run (resume)
        queues: list[list[tuple[TuningTask, Candidate]]] = []
        for task in self.tasks:
            schedules = self.source.matching(task)
            if not schedules:
                continue
            space = DesignSpace.of(task, self.target)
            queue = []
            for candidate in candidates_for(task, space, schedules, self.per_task):
                stats.applied += candidate.status == APPLIED
                stats.adapted += candidate.status == ADAPTED
                if candidate.status == FAILED:
                    stats.failed += 1
                    stats.candidates_invalid += 1
                    continue
                key = (workload_key(task.mod), str(candidate.schedule.trace))
                if key in known:
                    already += 1
                else:
                    queue.append((task, candidate))
            queues.append(queue)
        batch = [pair for round_ in _round_robin(queues) for pair in round_][: max(0, trials_left)]
        errors = measure_and_commit(
            [t for t, _ in batch],
            [c.schedule for _, c in batch],
            self.target,
            database,
            builder,
            runner,
        )
        for (task, candidate), error in zip(batch, errors, strict=True):
            if error is not None:
                stats.candidates_invalid += 1
                log.info("%s: transferred schedule of %s did not run: %s",
                         task.name, candidate.origin.task, error)  # fmt: skip
        stats.measured = len(batch)
        stats.candidates_tried = already + len(batch)  # a cut budget leaves the rest untried
        stats.transferred_tasks = transferred_tasks(database, self.tasks)
        stats.seconds = time.perf_counter() - start
        log.info(
            "transfer from %s: %d applied, %d adapted, %d failed; %d measured; %d task(s) faster",
            stats.source, stats.applied, stats.adapted, stats.failed, stats.measured,
            len(stats.transferred_tasks),
        )  # fmt: skip
        return len(batch)


def _round_robin(queues: list[list[Any]]) -> list[list[Any]]:
    """Position i of every queue, for i = 0, 1, ...: a cut budget leaves no task without its
    first candidate."""
    depth = max((len(q) for q in queues), default=0)
    return [[q[i] for q in queues if i < len(q)] for i in range(depth)]


def workload_key(mod: Any) -> int:
    import tvm_ffi

    return int(tvm_ffi.structural_hash(mod))


def measured_programs(database: Any) -> set[tuple[int, str]]:
    """(workload, trace text) of every record, failed ones included: never measured twice."""
    return {(workload_key(r.workload.mod), str(r.trace)) for r in database.get_all_tuning_records()}


def transferred_tasks(database: Any, tasks: list[TuningTask]) -> list[str]:
    """Tasks whose fastest record is a searched or transferred program, not the default."""
    from ..measure.baseline import is_default

    out = []
    for task in tasks:
        if not database.has_workload(task.mod):
            continue
        top = database.get_top_k(database.commit_workload(task.mod), 1)
        if top and not is_default(top[0]) and math.isfinite(float(top[0].run_secs[0])):
            out.append(task.name)
    return out
