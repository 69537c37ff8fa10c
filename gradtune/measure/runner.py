"""MetaSchedule's RPCRunner pointed at a tracker key: the one path for local and remote devices."""

from __future__ import annotations

from dataclasses import dataclass

from .rpc_fleet import Tracker


@dataclass(frozen=True)
class MeasureSettings:
    """How each candidate is timed on the device (recorded in every result)."""

    number: int = 3
    repeat: int = 3
    min_repeat_ms: int = 20
    enable_cpu_cache_flush: bool = False
    session_timeout_sec: int = 60
    mode: str = "fixed"  # or "adaptive" (measure/adaptive.py): number/repeat/min_repeat_ms unused


MEASURE_MODES = ("fixed", "adaptive")


def make_rpc_runner(
    tracker: Tracker, settings: MeasureSettings, max_workers: int = 1, task_best=None
):
    """An RPCRunner timing with ``settings.mode``'s evaluator (``adaptive.MeasuredRunner``);
    ``task_best``: the adaptive evaluator's task best so far (``adaptive.TaskBests``)."""
    from tvm.s_tir import meta_schedule as ms

    from .adaptive import AdaptiveSettings, MeasuredRunner

    rpc_config = ms.runner.RPCConfig(
        tracker_host=tracker.host,
        tracker_port=tracker.port,
        tracker_key=tracker.key,
        session_timeout_sec=settings.session_timeout_sec,
    )
    evaluator = ms.runner.EvaluatorConfig(
        number=settings.number,
        repeat=settings.repeat,
        min_repeat_ms=settings.min_repeat_ms,
        enable_cpu_cache_flush=settings.enable_cpu_cache_flush,
    )
    runner = ms.runner.RPCRunner(rpc_config, evaluator, max_workers=max_workers)
    return MeasuredRunner(runner, settings.mode, AdaptiveSettings(), task_best)
