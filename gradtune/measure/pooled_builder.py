"""gradtune's fast build in a worker pool that outlives one batch.

MetaSchedule's LocalBuilder starts a fresh pool per batch (against a worker memory leak); each
new worker imports TVM, which costs seconds per batch on a 2-core machine: more than the
builds of a 16-candidate batch when the machine is loaded, and time the tuning budget pays
every round. Recycling the pool every ``recycle`` batches keeps the leak bounded.
``metaschedule_builder`` hands the same pool to MetaSchedule's task scheduler.
"""

from __future__ import annotations

from typing import Any

from .builder import fast_build, worker_lifeline


class PooledBuilder:
    """Builds ``BuilderInput``s with ``fast_build`` in a reused pool; same results as
    MetaSchedule's LocalBuilder (a failure or a timeout is an error message, never raised)."""

    def __init__(self, max_workers: int, timeout_sec: float = 60.0, recycle: int = 25):
        self.max_workers, self.timeout_sec, self.recycle = max_workers, timeout_sec, recycle
        self._pool: Any = None
        self._uses = 0

    def build(self, inputs: list[Any]) -> list[Any]:
        from tvm.s_tir.meta_schedule.builder import BuilderResult
        from tvm.support.popen_pool import PopenPoolExecutor, StatusKind

        if self._pool is None or self._uses >= self.recycle:
            self.shutdown()
            self._pool = PopenPoolExecutor(
                max_workers=self.max_workers,
                timeout=self.timeout_sec,
                initializer=worker_lifeline(),
            )
        self._uses += 1
        results = []
        jobs = [(b.mod, b.target) for b in inputs]
        for res in self._pool.map_with_error_catching(_build_and_export, jobs):
            if res.status == StatusKind.COMPLETE:
                results.append(BuilderResult(res.value, None))
            elif res.status == StatusKind.TIMEOUT:
                results.append(BuilderResult(None, f"build timed out after {self.timeout_sec} s"))
            else:
                results.append(BuilderResult(None, f"build raised: {res.value}"))
        return results

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
            self._uses = 0


def metaschedule_builder(max_workers: int, timeout_sec: float = 60.0) -> Any:
    """A ``PooledBuilder`` behind MetaSchedule's ``PyBuilder`` seam, for ``tune_tasks``; its
    ``shutdown()`` stops the pool."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms

    @derived_object
    class MetaSchedulePooledBuilder(ms.builder.PyBuilder):
        def __init__(self) -> None:
            self.pooled = PooledBuilder(max_workers, timeout_sec)

        def build(self, build_inputs: list[Any]) -> list[Any]:
            return self.pooled.build(build_inputs)

        def shutdown(self) -> None:
            self.pooled.shutdown()

    return MetaSchedulePooledBuilder()


def _build_and_export(job: tuple[Any, Any]) -> str:
    """In a worker: what LocalBuilder's worker does with ``f_build=fast_build`` and no params,
    the module built and exported to a temporary artifact whose path is returned."""
    from tvm.s_tir.meta_schedule.builder.local_builder import default_export

    mod, target = job
    return default_export(fast_build(mod, target, None))
