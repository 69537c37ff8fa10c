"""MetaSchedule's RPCRunner pointed at a tracker key: the one path for local and remote devices."""

from __future__ import annotations

from dataclasses import dataclass

from .rpc_fleet import Tracker


@dataclass(frozen=True)
class MeasureSettings:
    """How each candidate is timed on the device (recorded in every result).

    Parameters
    ----------
    number : int, default 3
        Runs averaged into one measurement.
    repeat : int, default 3
        Measurements per candidate.
    min_repeat_ms : int, default 20
        Shortest duration of one measurement (TVM raises ``number`` to fill it).
    enable_cpu_cache_flush : bool, default False
        Flush the CPU caches before each measurement.
    session_timeout_sec : int, default 60
        Longest RPC session (one candidate's upload and timing); the server ends it then.
    server_wait_sec : float, default 60.0
        Longest time with no RPC server for the key registered with the tracker (or the
        tracker unreachable) before the run stops, resumable, instead of waiting for one.
    mode : str, default "fixed"
        ``fixed`` (TVM's evaluator with the settings above) or ``adaptive`` (micro-batches
        until the timing settles, ``measure/adaptive.py``; number/repeat/min_repeat_ms unused)
        or ``handoff`` (single runs, each after the pool rewrote the input, in ``repeat``
        groups, ``measure/handoff.py``; a CPU's fleet of gradtune's servers only).
    """

    number: int = 3
    repeat: int = 3
    min_repeat_ms: int = 20
    enable_cpu_cache_flush: bool = False
    session_timeout_sec: int = 60
    server_wait_sec: float = 60.0
    mode: str = "fixed"


MEASURE_MODES = ("fixed", "adaptive", "handoff")


def make_rpc_runner(
    tracker: Tracker, settings: MeasureSettings, max_workers: int = 1, task_best=None
):
    """An RPCRunner timing with ``settings.mode``'s evaluator (``adaptive.MeasuredRunner``);
    ``task_best``: the adaptive evaluator's task best so far (``adaptive.TaskBests``)."""
    from tvm.s_tir import meta_schedule as ms

    from .adaptive import AdaptiveSettings, MeasuredRunner
    from .builder import worker_lifeline
    from .rpc_session import BoundedSession

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
    runner = ms.runner.RPCRunner(
        rpc_config,
        evaluator,
        # A session request the tracker cannot serve (no server left, the tracker gone) would
        # otherwise wait forever.
        f_create_session=BoundedSession(wait_sec=settings.server_wait_sec),
        max_workers=max_workers,
        # Its pool's workers die with this process, a kill -9 included.
        initializer=worker_lifeline(),
    )
    return MeasuredRunner(runner, settings.mode, AdaptiveSettings(), task_best)
