"""Collecting the dataset: sample, build and measure the zoo's workloads over TVM RPC.

Workload by workload in priority order, first random programs (ReplayTrace over every sketch)
then a short evolutionary search, each batch committed to the ``DatasetStore`` as soon as it is
measured. Resumable: a rerun counts what is stored and measures only what is missing. Failed
builds or runs are not stored as records; they are counted per workload in the manifest (with
the first error), so every record in the database is a valid measurement.

Stopping is cooperative: ``collect`` polls a ``StopSignal`` between batches, because a
KeyboardInterrupt raised inside a TVM callback can come back as an ordinary TVM error and be
lost, or abort the process and orphan the RPC fleet. ``stop_on_signals`` sets the signal from
SIGINT / SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..measure.pooled_builder import PooledBuilder
from ..stop import StopSignal, stop_on_signals
from .card import load_manifest, utc_now, write_card, write_manifest
from .hardware import describe
from .settings import CollectSettings
from .store import DatasetStore, trace_key
from .workloads import WorkloadInfo, WorkloadProgress, extract_workloads, prioritize

log = logging.getLogger(__name__)


class Collector:
    """Samples, builds and measures candidates of each workload into a ``DatasetStore``."""

    def __init__(
        self,
        store: DatasetStore,
        target: Any,
        tracker: Any,
        settings: CollectSettings,
        stop: StopSignal | None = None,
    ):
        from ..measure.rpc_session import DeviceWatch
        from ..measure.runner import MeasureSettings, make_rpc_runner
        from ..tvm_compat import register_tensor_intrinsics

        register_tensor_intrinsics(target.kind.name)
        self.store = store
        self.target = target
        self.settings = settings
        self.stop = stop if stop is not None else StopSignal()
        self.measure = MeasureSettings(
            number=settings.number,
            repeat=settings.repeat,
            min_repeat_ms=settings.min_repeat_ms,
            server_wait_sec=settings.server_wait_sec,
        )
        self.builder = PooledBuilder(settings.builder_workers, settings.build_timeout_sec)
        self.runner = make_rpc_runner(tracker, self.measure, max_workers=settings.rpc_servers)
        self.devices = DeviceWatch(self.stop)

    def close(self) -> None:
        self.runner.pool.shutdown()
        self.builder.shutdown()

    def _context(self, info: WorkloadInfo, strategy: Any, salt: int) -> Any:
        from tvm.s_tir import meta_schedule as ms

        seed = (self.settings.seed * 1_000_003 + int(info.key) % 1_000_000 + salt) % (2**31 - 1)
        return ms.TuneContext(
            mod=info.mod,
            target=self.target,
            space_generator="post-order-apply",
            search_strategy=strategy,
            task_name=f"w{info.key}",
            rand_state=max(1, seed),
            num_threads=int(self.target.attrs.get("num-cores", 1)),
        )

    def run_workload(
        self,
        info: WorkloadInfo,
        phase: str,
        goal: int,
        state: WorkloadProgress,
        on_batch: Callable[[int], None] | None = None,
    ) -> None:
        """Measure until ``info`` holds ``goal`` valid records (or fails / runs out of programs,
        or ``self.stop`` is set: the batch being measured then still finishes and is stored).

        ``phase`` is ``random`` (ReplayTrace: random decisions across every sketch, a random
        cost model) or ``evolutionary`` (MetaSchedule's EvolutionarySearch seeded with the best
        measured programs and an XGBModel trained on this workload's records).
        """
        from tvm.s_tir import meta_schedule as ms

        need = goal - self.store.counts.get(info.key, 0)
        if need <= 0 or state.exhausted:
            return
        if phase == "random":
            strategy = ms.search_strategy.ReplayTrace(max_fail_count=20)
            cost_model = ms.cost_model.RandomModel(seed=self.settings.seed + 1)
        else:
            # A small population and two generations: ~10 s per search here instead of ~60 s
            # with the defaults; seeded with the best measured programs.
            strategy = ms.search_strategy.EvolutionarySearch(
                population_size=128, init_min_unmeasured=32, genetic_num_iters=2
            )
            cost_model = ms.cost_model.XGBModel(num_warmup_samples=0, adaptive_training=False)
        salt = self.store.counts.get(info.key, 0) + state.failed
        ctx = self._context(info, strategy, salt)
        workload = self.store.workload(info.mod)
        if phase == "evolutionary":
            self._warm_start(ctx, cost_model, workload)
        seen = self.store.traces.setdefault(info.key, set())
        # The evolutionary phase asks for its whole share in one search: each search costs
        # 10-20 s here (population sampling + 2 generations), more than measuring a batch.
        batch = self.settings.batch_size if phase == "random" else max(1, need)
        # Duplicates are dropped, so ask for more than needed; stop when the space runs dry.
        ctx.pre_tuning(
            max_trials=need * 4 + batch,
            num_trials_per_iter=batch,
            database=self.store.database,
            cost_model=cost_model,
        )
        dry_batches = 0
        try:
            while self.store.counts.get(info.key, 0) < goal and not self.stop.stopped:
                if state.failed >= self.settings.max_failures_per_workload:
                    break
                candidates = ctx.search_strategy.generate_measure_candidates()
                if not candidates:
                    state.exhausted = phase == "random"
                    break
                fresh = []
                for cand in candidates:
                    k = trace_key(cand.sch.trace)
                    if k not in seen:
                        seen.add(k)
                        fresh.append(cand)
                room = goal - self.store.counts.get(info.key, 0)
                fresh = fresh[:room]
                if not fresh:
                    dry_batches += 1
                    # ReplayTrace never stops by itself on a tiny design space.
                    if dry_batches >= 5:
                        state.exhausted = phase == "random"
                        break
                    ctx.search_strategy.notify_runner_results(candidates, [])
                    continue
                dry_batches = 0
                results = self._measure(fresh)
                # Lost devices say nothing of the candidates: stop before counting failures.
                self.devices.note(results)
                self.devices.raise_if_lost("rerun the same command to resume")
                records = []
                for cand, result in zip(fresh, results, strict=True):
                    if result.error_msg is None and result.run_secs:
                        records.append(
                            ms.database.TuningRecord(
                                trace=cand.sch.trace,
                                workload=workload,
                                run_secs=[float(s) for s in result.run_secs],
                                target=self.target,
                                args_info=cand.args_info,
                            )
                        )
                    else:
                        state.failed += 1
                        state.first_error = state.first_error or _short_error(result.error_msg)
                self.store.commit(info.key, records)
                state.valid = self.store.counts.get(info.key, 0)
                ctx.search_strategy.notify_runner_results(fresh, results)
                cost_model.update(ctx, fresh, results)
                if on_batch is not None:
                    on_batch(len(fresh))
        finally:
            ctx.search_strategy.post_tuning()

    def _measure(self, candidates: list[Any]) -> list[Any]:
        """Build locally, run over RPC; a build failure becomes a failed RunnerResult."""
        from tvm.s_tir import meta_schedule as ms

        t0 = time.perf_counter()
        built = self.builder.build(
            [ms.builder.BuilderInput(c.sch.mod, self.target) for c in candidates]
        )
        t1 = time.perf_counter()
        inputs, where = [], []
        results: list[Any] = [None] * len(candidates)
        for i, (cand, b) in enumerate(zip(candidates, built, strict=True)):
            if b.error_msg is not None:
                results[i] = ms.runner.RunnerResult(None, f"build: {b.error_msg}")
                continue
            inputs.append(ms.runner.RunnerInput(b.artifact_path, "cpu", cand.args_info))
            where.append(i)
        try:
            futures = self.runner.run(inputs) if inputs else []
            for i, future in zip(where, futures, strict=True):
                results[i] = future.result()
            log.debug(
                "batch of %d: build %.1f s, run %.1f s",
                len(candidates),
                t1 - t0,
                time.perf_counter() - t1,
            )
        finally:
            for b in built:
                if b.artifact_path:
                    shutil.rmtree(os.path.dirname(b.artifact_path), ignore_errors=True)
        return results

    def _warm_start(self, ctx: Any, cost_model: Any, workload: Any) -> None:
        """Train the XGBModel on the workload's measured records before the search uses it."""
        from tvm.s_tir import meta_schedule as ms

        records = self.store.database.get_top_k(workload, 100_000)
        candidates, results = [], []
        for record in records:
            try:
                candidates.append(record.as_measure_candidate())
            except Exception:  # a trace that no longer applies teaches nothing
                continue
            results.append(ms.runner.RunnerResult(list(record.run_secs), None))
        if len(candidates) >= 2:
            cost_model.update(ctx, candidates, results)


def _short_error(msg: str | None) -> str:
    lines = [line for line in (msg or "unknown error").strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "unknown error")[:300]


# --------------------------------------------------------------------------- the collection


def collect(
    data_dir: str | Path,
    zoo_config: str | Path,
    target_config: dict[str, Any],
    settings: CollectSettings,
    tracker: Any | None = None,
    max_workloads: int | None = None,
    time_budget: float | None = None,
    console: Any = None,
    stop: StopSignal | None = None,
) -> dict[str, Any]:
    """Measure the zoo's workloads into ``data_dir`` until each holds its target count.

    Resumable: what is already stored counts, only the missing records are measured. Returns
    the manifest. ``tracker=None`` starts a local RPC fleet for the duration. Once ``stop`` is
    set, the batch being measured finishes and is stored, the manifest and card are written,
    the fleet is stopped and the manifest returned.
    """
    from rich.console import Console

    from ..measure.rpc_fleet import LocalFleet
    from ..target import make_target
    from ..zoo import load_config

    stop = stop if stop is not None else StopSignal()
    console = console or Console(stderr=True)
    data_dir = Path(data_dir)
    target = make_target(target_config)
    entries = load_config(zoo_config)
    started, t0 = utc_now(), time.perf_counter()
    with console.status("importing the zoo and extracting tasks"):
        every = prioritize(extract_workloads(entries, target))
    workloads = every[:max_workloads] if max_workloads is not None else every
    selected = {w.key for w in workloads}
    console.print(
        f"{len(workloads)} distinct workloads from {sum(len(e.batches) for e in entries)} "
        f"zoo models; target {json.dumps(target_config)}"
    )
    store = DatasetStore(data_dir, target_config, machine=session_machine(target_config, tracker))
    previous = load_manifest(data_dir)
    manifest = previous.get("workloads", {})
    spent = float(previous.get("collection_seconds", 0.0))
    progress = {}
    for info in every:
        old = manifest.get(info.key, {})
        progress[info.key] = WorkloadProgress(
            valid=store.counts.get(info.key, 0),
            failed=int(old.get("failed", 0)),
            first_error=str(old.get("first_error", "")),
            exhausted=bool(old.get("exhausted", False)),
        )

    def save() -> dict[str, Any]:
        # Every selected workload, and any other the database holds records of (an earlier,
        # differently capped collection): the manifest describes the whole database.
        listed = [w for w in every if w.key in selected or store.counts.get(w.key)]
        for w in listed:
            progress[w.key].valid = store.counts.get(w.key, 0)
        return write_manifest(
            data_dir, listed, progress, target_config, settings, started,
            spent + time.perf_counter() - t0, store.machine,
        )  # fmt: skip

    with contextlib.ExitStack() as stack:
        if tracker is None:
            tracker = stack.enter_context(LocalFleet(num_servers=settings.rpc_servers))
        collector = Collector(store, target, tracker, settings, stop)
        stack.callback(collector.close)
        plan = [
            ("random", settings.random_per_workload),
            ("evolutionary", settings.target_per_workload),
        ]
        missing = sum(
            max(0, settings.target_per_workload - store.counts.get(w.key, 0))
            for w in workloads
            if not progress[w.key].exhausted
        )
        console.print(f"{missing} candidates to measure ({len(store.database)} already stored)")
        # Workload by workload (random, then evolutionary), in priority order: a collection cut
        # short holds complete workloads of the most important families.
        with _progress(console) as bar:
            job = bar.add_task("measuring", total=missing)
            for n, info in enumerate(workloads, 1):
                if stop.stopped:
                    break
                if time_budget is not None and time.perf_counter() - t0 > time_budget:
                    break
                for phase, goal in plan:
                    if stop.stopped:
                        break
                    state = progress[info.key]
                    before = store.counts.get(info.key, 0)
                    if before >= goal or state.exhausted:
                        continue
                    bar.update(
                        job, description=f"{phase} {n}/{len(workloads)} {info.kernel_class[:40]}"
                    )
                    t_w = time.perf_counter()
                    collector.run_workload(
                        info, phase, goal, state, on_batch=lambda k: bar.advance(job, k)
                    )
                    write_card(data_dir, save())
                    log.info(
                        "%s %s [%s] %d -> %d records (%d failed%s) in %.0f s; total %d",
                        phase, info.key, info.kernel_class, before, state.valid, state.failed,
                        ", design space exhausted" if state.exhausted else "",
                        time.perf_counter() - t_w, len(store.database),
                    )  # fmt: skip
    result = save()
    write_card(data_dir, result)
    return result


def session_machine(target_config: dict[str, Any], tracker: Any | None) -> dict[str, Any]:
    """The descriptor of what measures this session: this host when the RPC servers run here
    (the local fleet, or a tracker on loopback), else this host plus the tracker's name; with
    the thread count the servers run kernels on. The local fleet's servers are started on the
    target's; a tracker's server, on this host or not, sizes its pool from the environment it
    was started in, so it is asked (None if busy)."""
    from ..measure.rpc_fleet import is_loopback, server_threads
    from ..threads import target_threads

    if tracker is None:
        return describe(target_config, threads=target_threads(target_config))
    here = is_loopback(str(tracker.host))
    devices = None if here else f"rpc tracker {tracker.host}:{tracker.port} key {tracker.key}"
    return describe(target_config, devices=devices, threads=server_threads(tracker))


@contextlib.contextmanager
def _progress(console: Any) -> Iterator[Any]:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), TimeRemainingColumn(), console=console,
    ) as bar:  # fmt: skip
        yield bar


def collect_until_signalled(
    data_dir: str | Path,
    zoo_config: str | Path,
    target_config: dict[str, Any],
    settings: CollectSettings,
    tracker: Any | None = None,
    max_workloads: int | None = None,
    time_budget: float | None = None,
) -> tuple[dict[str, Any], bool]:
    """``collect`` with its own ``StopSignal`` set by SIGINT / SIGTERM (``stop_on_signals``);
    returns the manifest and whether a signal stopped the collection short."""
    stop = StopSignal()
    with stop_on_signals(stop):
        manifest = collect(
            data_dir, zoo_config, target_config, settings, tracker=tracker,
            max_workloads=max_workloads, time_budget=time_budget, stop=stop,
        )  # fmt: skip
    return manifest, stop.stopped
