"""Adaptive measurement: time a candidate until its latency is known well enough, then stop.

AdaTune (Li et al., NeurIPS 2020, §4.1) times a candidate in micro-batches and stops once the
coefficient of variation (CV) of its measurements falls below 10%, after at least 3
micro-batches; it reports this cutting hardware measurement time 2.5× at little loss of
accuracy. gradtune's fixed measurement instead spends number=3 × repeat=3 × ≥ 20 ms on every
candidate, however stable it is. Here a micro-batch is one ``time_evaluator`` call's repeat:
``n`` back-to-back runs of the kernel sized to last ``batch_ms``, whose mean is one value of
``run_secs``. The CV is taken over those per-micro-batch means (the paper takes it over the
running throughput after each micro-batch, which settles faster because each value includes
the ones before). Two more stops: a candidate whose first micro-batches are all ``k``× slower
than its task's best so far is cut there, its measured means recorded as they are (it cannot
become the task's best, so a precise latency buys nothing); and a cap on micro-batches, for a
device too noisy to converge, which flags the candidate.

Why this shape. MetaSchedule's ``RPCRunner`` runs each candidate in a ``PopenPoolExecutor``
worker process: it opens an RPC session, uploads the module, allocates arguments and calls
``f_run_evaluator(session, rt_mod, device, evaluator_config, repeated_args)``; what that
returns becomes the record's ``run_secs``. That seam is the one place with the device in
hand, through the session, so the evaluator lives there and serves the local fleet and a
remote device alike. Two facts must cross the process boundary:

- In: the task's best latency so far. The pool pickles (with cloudpickle) the evaluator
  together with every submission, so ``MeasuredRunner.run`` binds a ``functools.partial`` of
  the module-level evaluator to the best latency of the batch's task just before handing the
  batch to the ``RPCRunner``. It is read when submitted, never shared mutable state between
  processes. MetaSchedule sends one task's candidates per ``Runner.run`` call, but the call
  names no task; the candidates' argument signature (dtypes and shapes, the same for every
  candidate of a task) identifies it. Tasks sharing a signature share the largest of their
  bests, so a candidate is never cut against a faster task's best.
- Out: what timing cost (kernel runs and device seconds). ``RunnerResult`` carries only
  ``run_secs`` and an error, and ``run_secs`` stays honest latencies in TVM's format, so each
  worker appends one JSON line per candidate to a ledger file the runner owns (one small
  ``O_APPEND`` write, which concurrent workers cannot interleave) and the tuning loop sums it.

The fixed evaluator goes through the same runner: it makes exactly TVM's default
``time_evaluator`` call and ledgers its cost, which TVM does not report; the runs its
``min_repeat_ms`` calibration added are recovered by replaying TVM's rule on the measured
per-run times (exact when a kernel's run time is steady).

A candidate that hangs or crashes while timed is bounded as under the fixed evaluator: the
RPC server ends the session after ``session_timeout_sec`` and MetaSchedule records an error.
Its partial timing is not in the ledger.
"""

from __future__ import annotations

import functools
import json
import math
import os
import statistics
import tempfile
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.runner import PyRunner
from tvm.s_tir.meta_schedule.runner.rpc_runner import default_run_evaluator

Signature = tuple[str, ...]  # a candidate's arguments, one JSON ArgInfo each

# Why a candidate's timing stopped (the ledger's "stop" field).
CONVERGED, SLOW, CAP, FIXED, HANDOFF = "converged", "slow", "cap", "fixed", "handoff"


class AdaptiveSettings(NamedTuple):
    """How the adaptive evaluator decides when a candidate is measured enough.

    Parameters
    ----------
    cv_threshold : float, default 0.10
        Stop once the coefficient of variation (sample standard deviation / mean) of the
        micro-batch means is below this (AdaTune's 10%).
    min_batches : int, default 3
        Micro-batches measured before the CV may stop a candidate (AdaTune's 3).
    max_batches : int, default 10
        The cap: a candidate whose CV is still above the threshold stops here, flagged.
    slow_factor : float, default 2.0
        k: a candidate whose micro-batches are all k× slower than its task's best so far stops.
    slow_batches : int, default 2
        Micro-batches measured before ``slow_factor`` may stop a candidate (one noisy batch
        alone never does).
    batch_ms : float, default 5.0
        Device time a micro-batch aims at; its runs are this over one run's time (≥ 1).
    """

    cv_threshold: float = 0.10
    min_batches: int = 3
    max_batches: int = 10
    slow_factor: float = 2.0
    slow_batches: int = 2
    batch_ms: float = 5.0


def coefficient_of_variation(values: Sequence[float]) -> float:
    """Sample standard deviation / mean; inf for fewer than two values or a zero mean."""
    if len(values) < 2:
        return math.inf
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean > 0 else math.inf


def stop_reason(
    batch_means: Sequence[float], best_s: float, settings: AdaptiveSettings
) -> str | None:
    """Why timing stops after ``batch_means`` (seconds per run), or None to time another batch.

    ``best_s`` is the task's best latency so far (inf when none is known). A candidate that
    converged is reported so even if it is also slow: its latency is as precise as any.
    """
    n = len(batch_means)
    if n >= settings.min_batches and coefficient_of_variation(batch_means) < settings.cv_threshold:
        return CONVERGED
    if (
        n >= settings.slow_batches
        and math.isfinite(best_s)
        and min(batch_means) > settings.slow_factor * best_s
    ):
        return SLOW
    if n >= settings.max_batches:
        return CAP
    return None


def batches_until_decision(done: int, best_known: bool, settings: AdaptiveSettings) -> int:
    """Micro-batches to take in the next ``time_evaluator`` call: up to the next point where
    ``stop_reason`` can stop. Every call pays an untimed warm-up run, so batches that cannot
    end the timing are taken in one call."""
    if best_known and done < settings.slow_batches:
        target = settings.slow_batches
    elif done < settings.min_batches:
        target = settings.min_batches
    else:
        target = done + 1
    return max(1, min(target, settings.max_batches) - done)


def runs_per_batch(run_s: float, settings: AdaptiveSettings) -> int:
    """Runs making a micro-batch of ``batch_ms`` for a kernel taking ``run_s`` per run."""
    if not run_s > 0:  # below the timer's resolution
        return 1_000_000
    return max(1, min(1_000_000, math.ceil(settings.batch_ms / 1e3 / run_s)))


@dataclass(frozen=True)
class Timing:
    """One candidate's timing, as ledgered.

    Parameters
    ----------
    run_secs : list of float
        What the record keeps: the per-micro-batch means (adaptive) or per-repeat means
        (fixed), seconds per run.
    runs : int
        Kernel executions, untimed warm-ups and calibration runs included.
    seconds : float
        Device seconds those executions took: timed ones as measured, untimed ones at the
        per-run time their call measured.
    stop : str
        ``converged``, ``slow``, ``cap`` (the flagged ones) or ``fixed``.
    """

    run_secs: list[float]
    runs: int
    seconds: float
    stop: str


def time_adaptively(
    timer: Callable[[int, int], list[float]], best_s: float, settings: AdaptiveSettings
) -> Timing:
    """Time a kernel through ``timer(number, repeat)`` (one ``time_evaluator`` call: an
    untimed warm-up run, then ``repeat`` means of ``number`` runs each) until ``stop_reason``.

    A one-run probe sizes the micro-batches; for a kernel longer than ``batch_ms`` it is the
    first micro-batch, otherwise it is left out of ``run_secs``: one run is not a micro-batch.
    """
    (probe,) = timer(1, 1)
    runs, seconds = 2, 2 * probe
    number = runs_per_batch(probe, settings)
    means: list[float] = [probe] if number == 1 else []
    while (stop := stop_reason(means, best_s, settings)) is None:
        if means:  # the better estimate of one run than the probe
            number = runs_per_batch(statistics.median(means), settings)
        repeat = batches_until_decision(len(means), math.isfinite(best_s), settings)
        results = timer(number, repeat)
        means += results
        runs += 1 + number * repeat
        seconds += statistics.fmean(results) + number * sum(results)
    return Timing(means, runs, seconds, stop)


def replay_fixed_cost(
    run_secs: Sequence[float], number: int, repeat: int, min_repeat_ms: float
) -> tuple[int, float]:
    """(runs, device seconds) of TVM's ``time_evaluator`` calls that returned ``run_secs``.

    Each call runs the kernel once untimed, then ``repeat`` times ``number`` runs; a repeat
    shorter than ``min_repeat_ms`` is retried with ``number`` raised to
    max(min_repeat_ms / run time + 1, 1.618 × number), which later repeats of the same call
    keep. Those retries are not reported; they are recovered here from each repeat's run time.
    """
    runs, seconds, n = 0, 0.0, number
    for i, t in enumerate(run_secs):
        if i % repeat == 0:  # a new call: its warm-up run, and TVM's starting number again
            runs, seconds, n = runs + 1, seconds + t, number
        while min_repeat_ms > 0 and t > 0 and n * t * 1e3 < min_repeat_ms:
            runs, seconds = runs + n, seconds + n * t
            n = int(max(min_repeat_ms / (t * 1e3) + 1, n * 1.618))
        runs, seconds = runs + n, seconds + n * t
    return runs, seconds


@dataclass(frozen=True)
class MeasureCost:
    """What timing the candidates cost, summed over a runner's ledger.

    Parameters
    ----------
    candidates : int
        Candidates timed to the end (ones that failed or timed out are not counted).
    kernel_runs : int
        Kernel executions, untimed ones included.
    seconds : float
        Device seconds of those executions.
    unconverged : int
        Candidates stopped at the cap with their CV above the threshold.
    slow : int
        Candidates cut for being ``slow_factor``× slower than their task's best.
    """

    candidates: int = 0
    kernel_runs: int = 0
    seconds: float = 0.0
    unconverged: int = 0
    slow: int = 0


def write_ledger(path: str, timing: Timing) -> None:
    """Append ``timing``'s cost to the ledger at ``path`` (one line, one atomic write)."""
    line = {"runs": timing.runs, "seconds": timing.seconds, "batches": len(timing.run_secs)}
    data = (json.dumps({**line, "stop": timing.stop}) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def read_ledger(path: str) -> MeasureCost:
    """The totals of the ledger at ``path``."""
    totals = {"candidates": 0, "kernel_runs": 0, "seconds": 0.0, "unconverged": 0, "slow": 0}
    with open(path) as f:
        for line in f:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:  # a worker killed while writing its line
                continue
            totals["candidates"] += 1
            totals["kernel_runs"] += entry["runs"]
            totals["seconds"] += entry["seconds"]
            totals["unconverged"] += entry["stop"] == CAP
            totals["slow"] += entry["stop"] == SLOW
    return MeasureCost(**totals)


def adaptive_run_evaluator(
    session: Any,
    rt_mod: Any,
    device: Any,
    evaluator_config: Any,
    repeated_args: list[Any],
    *,
    settings: AdaptiveSettings,
    best_s: float,
    ledger: str,
) -> list[float]:
    """``RPCRunner``'s ``f_run_evaluator``, adaptive: micro-batches until ``stop_reason``.

    Of ``evaluator_config`` only ``enable_cpu_cache_flush`` applies: ``settings`` replace
    number, repeat and min_repeat_ms. Successive calls cycle through ``repeated_args``.
    """
    f_preproc = "cache_flush_cpu_non_first_arg" if evaluator_config.enable_cpu_cache_flush else ""
    calls = 0

    def timer(number: int, repeat: int) -> list[float]:
        nonlocal calls
        evaluator = rt_mod.time_evaluator(
            rt_mod.entry_name, device, number=number, repeat=repeat, min_repeat_ms=0,
            f_preproc=f_preproc,
        )  # fmt: skip
        args = repeated_args[calls % len(repeated_args)]
        calls += 1
        device.sync()
        return [float(x) for x in evaluator(*args).results]

    timing = time_adaptively(timer, best_s, settings)
    write_ledger(ledger, timing)
    return timing.run_secs


def fixed_run_evaluator(
    session: Any,
    rt_mod: Any,
    device: Any,
    evaluator_config: Any,
    repeated_args: list[Any],
    *,
    ledger: str,
) -> list[float]:
    """``RPCRunner``'s default ``f_run_evaluator``, its cost ledgered (``replay_fixed_cost``)."""
    run_secs = default_run_evaluator(session, rt_mod, device, evaluator_config, repeated_args)
    runs, seconds = replay_fixed_cost(
        run_secs, evaluator_config.number, evaluator_config.repeat, evaluator_config.min_repeat_ms
    )
    write_ledger(ledger, Timing(run_secs, runs, seconds, FIXED))
    return run_secs


def arg_signature(args_info: Sequence[Any]) -> Signature:
    """The signature of a candidate's (or a task's) ``ArgInfo`` list."""
    return tuple(json.dumps(info.as_json()) for info in args_info)


def prim_func_signature(mod: Any) -> Signature:
    """The signature of a task's module (its candidates' arguments are the same)."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    return arg_signature(ArgInfo.from_prim_func(mod["main"]))


class TaskBests:
    """The best latency so far (seconds) of the task whose candidates have ``signature``.

    ``best_us`` is read at each call (the tuning loop keeps it current, µs per task); tasks
    sharing a signature answer the largest of their bests, and inf until each has one.
    """

    def __init__(self, signatures: dict[str, Signature], best_us: dict[str, float]) -> None:
        self.tasks: dict[Signature, list[str]] = {}
        for name, signature in signatures.items():
            self.tasks.setdefault(signature, []).append(name)
        self.best_us = best_us

    def __call__(self, signature: Signature) -> float:
        names = self.tasks.get(signature)
        if not names:
            return math.inf
        return max(self.best_us.get(name, math.inf) for name in names) * 1e-6


@derived_object
class MeasuredRunner(PyRunner):
    """MetaSchedule's ``RPCRunner`` with gradtune's evaluator bound per batch, and its cost.

    Parameters
    ----------
    rpc_runner : RPCRunner
        The runner doing the work (its ``f_run_evaluator`` is set here).
    mode : str
        ``fixed``, ``adaptive`` or ``handoff`` (``measure/handoff.py``).
    settings : AdaptiveSettings
        The adaptive evaluator's settings.
    task_best : callable or None
        Signature → the task's best latency so far in seconds (``TaskBests``); None: no
        candidate is cut for being slow.
    """

    def __init__(
        self,
        rpc_runner: Any,
        mode: str,
        settings: AdaptiveSettings,
        task_best: Callable[[Signature], float] | None,
    ) -> None:
        super().__init__()
        self.rpc_runner = rpc_runner
        self.pool = rpc_runner.pool  # the caller shuts it down, as an RPCRunner's
        self.mode = mode
        self.settings = settings
        self.task_best = task_best
        fd, self.ledger = tempfile.mkstemp(prefix="gradtune-measure-", suffix=".jsonl")
        os.close(fd)
        # The ledger outlives no runner: removed when this one is collected or at exit.
        weakref.finalize(self, remove_file, self.ledger)
        if mode == "fixed":
            rpc_runner.f_run_evaluator = functools.partial(fixed_run_evaluator, ledger=self.ledger)
        elif mode == "handoff":
            from .handoff import handoff_run_evaluator

            rpc_runner.f_run_evaluator = functools.partial(
                handoff_run_evaluator, ledger=self.ledger
            )

    def run(self, runner_inputs: list[Any]) -> list[Any]:
        if self.mode == "adaptive":
            best_s = math.inf
            if runner_inputs and self.task_best is not None:
                best_s = self.task_best(arg_signature(runner_inputs[0].args_info))
            self.rpc_runner.f_run_evaluator = functools.partial(
                adaptive_run_evaluator, settings=self.settings, best_s=best_s, ledger=self.ledger
            )
        return self.rpc_runner.run(runner_inputs)

    def cost(self) -> MeasureCost:
        """What timing cost so far (the ledger's totals)."""
        return read_ledger(self.ledger)


def remove_file(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
