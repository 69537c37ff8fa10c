"""The adaptive evaluator: its stopping rule on synthetic timings, its cost ledger, and a real
tuning run through a local RPC fleet with it (slow)."""

from __future__ import annotations

import functools
import json
import math
import statistics

import pytest

from gradtune.measure.adaptive import (
    CAP,
    CONVERGED,
    SLOW,
    AdaptiveSettings,
    TaskBests,
    Timing,
    adaptive_run_evaluator,
    batches_until_decision,
    coefficient_of_variation,
    read_ledger,
    replay_fixed_cost,
    stop_reason,
    time_adaptively,
    write_ledger,
)

SETTINGS = AdaptiveSettings()


class SyntheticTimer:
    """Stands for one ``time_evaluator`` call: each requested repeat returns the next value
    of ``values`` (the probe's too); it records every (number, repeat) asked for."""

    def __init__(self, values):
        self.values = iter(values)
        self.calls = []

    def __call__(self, number, repeat):
        self.calls.append((number, repeat))
        return [next(self.values) for _ in range(repeat)]


def test_cv_is_sample_std_over_mean():
    assert coefficient_of_variation([1.0]) == math.inf
    assert coefficient_of_variation([2.0, 2.0, 2.0]) == 0.0
    assert coefficient_of_variation([1.0, 3.0]) == pytest.approx(statistics.stdev([1, 3]) / 2)


def test_steady_kernel_converges_after_the_minimum_batches():
    steady = [1.00e-4, 1.01e-4, 0.99e-4]
    assert stop_reason(steady[:2], math.inf, SETTINGS) is None  # fewer than 3 batches
    assert stop_reason(steady, math.inf, SETTINGS) == CONVERGED

    timer = SyntheticTimer([1.2e-4, *steady, *[1e-4] * 20])  # a probe, then the batches
    timing = time_adaptively(timer, math.inf, SETTINGS)
    assert timing.stop == CONVERGED and timing.run_secs == steady
    # The probe sizes the batches to batch_ms (5 ms / 0.12 ms → 42 runs); with no best known
    # the three batches a decision needs come in one call.
    assert timer.calls == [(1, 1), (42, 3)]
    assert timing.runs == 2 + 1 + 42 * 3


def test_noisy_kernel_stops_at_the_cap_flagged(tmp_path):
    noisy = [1e-4, 2e-4] * 20  # CV ≈ 35% however many batches
    timer = SyntheticTimer([1e-4, *noisy])
    timing = time_adaptively(timer, math.inf, SETTINGS)
    assert timing.stop == CAP
    assert timing.run_secs == noisy[: SETTINGS.max_batches]
    assert sum(repeat for _, repeat in timer.calls[1:]) == SETTINGS.max_batches

    ledger = str(tmp_path / "ledger.jsonl")
    write_ledger(ledger, timing)
    write_ledger(ledger, Timing([1e-4] * 3, 100, 0.01, CONVERGED))
    cost = read_ledger(ledger)
    assert (cost.candidates, cost.unconverged, cost.slow) == (2, 1, 0)
    assert cost.kernel_runs == timing.runs + 100
    assert cost.seconds == pytest.approx(timing.seconds + 0.01)


def test_candidate_far_slower_than_the_task_best_is_cut_with_its_measured_latency():
    best = 1e-4
    slow = [3.1e-4, 2.9e-4]  # noisy enough never to converge at 3 batches
    timer = SyntheticTimer([3e-4, *slow, 5e-4, 3e-4])
    timing = time_adaptively(timer, best, SETTINGS)
    assert timing.stop == SLOW
    assert timing.run_secs == slow  # what was measured, not a penalty value
    assert [repeat for _, repeat in timer.calls] == [1, SETTINGS.slow_batches]


def test_one_slow_batch_alone_does_not_cut_a_candidate():
    best = 1e-4
    # A first batch hit by interference, then the kernel's real 1.05× speed.
    timer = SyntheticTimer([1e-4, 3e-4, 1.05e-4, 1.05e-4, 1.04e-4, 1.05e-4, *[1.05e-4] * 10])
    timing = time_adaptively(timer, best, SETTINGS)
    assert timing.stop != SLOW
    assert stop_reason([3e-4, 1.05e-4], best, SETTINGS) is None
    # Not slow enough: 1.5× the best is measured to convergence.
    assert stop_reason([1.5e-4, 1.5e-4], best, SETTINGS) is None


def test_kernel_longer_than_a_batch_counts_its_probe_as_the_first_batch():
    long_run = 8e-3  # > batch_ms: one run per micro-batch
    timer = SyntheticTimer([long_run] * 10)
    timing = time_adaptively(timer, math.inf, SETTINGS)
    assert timing.stop == CONVERGED and len(timing.run_secs) == SETTINGS.min_batches
    assert timer.calls == [(1, 1), (1, 2)]
    assert timing.runs == 2 + 3  # two calls, each an untimed warm-up and its timed runs
    assert timing.seconds == pytest.approx(5 * long_run)


def test_batches_come_in_one_call_up_to_each_decision_point():
    assert batches_until_decision(0, False, SETTINGS) == 3
    assert batches_until_decision(0, True, SETTINGS) == 2  # the slow check comes first
    assert batches_until_decision(2, True, SETTINGS) == 1
    assert batches_until_decision(5, False, SETTINGS) == 1
    assert batches_until_decision(0, False, SETTINGS._replace(max_batches=2)) == 2


def test_fixed_cost_replays_tvms_min_repeat_ms_calibration():
    # A 10 ms kernel: 3 runs already last 20 ms; a warm-up, then 3 × 3 runs.
    runs, seconds = replay_fixed_cost([0.01] * 3, number=3, repeat=3, min_repeat_ms=20)
    assert runs == 1 + 9 and seconds == pytest.approx(10 * 0.01)
    # A 1 µs kernel: 3 runs (3 µs) are too short, TVM retries with 20 ms / 1 µs + 1 runs,
    # and keeps that number for the call's later repeats.
    runs, seconds = replay_fixed_cost([1e-6] * 3, number=3, repeat=3, min_repeat_ms=20)
    assert runs == 1 + 3 + 3 * 20_001
    assert seconds == pytest.approx(runs * 1e-6)
    # Two calls (alloc_repeat=2): each starts over from `number`, with its own warm-up.
    runs2, _ = replay_fixed_cost([1e-6] * 6, number=3, repeat=3, min_repeat_ms=20)
    assert runs2 == 2 * runs


def test_task_best_is_the_largest_of_tasks_sharing_a_signature():
    bests = {"add": 10.0, "multiply": 30.0}
    task_best = TaskBests({"add": ("a",), "multiply": ("a",), "conv": ("c",)}, bests)
    assert task_best(("a",)) == pytest.approx(30e-6)  # never cut against a faster task's best
    assert task_best(("c",)) == math.inf  # not measured yet
    assert task_best(("unknown",)) == math.inf
    bests["conv"] = 5.0  # the tuning loop's dict, read live
    assert task_best(("c",)) == pytest.approx(5e-6)


def test_bound_evaluator_travels_to_pool_workers_by_reference():
    import cloudpickle

    bound = functools.partial(adaptive_run_evaluator, settings=SETTINGS, best_s=1e-4, ledger="x")
    restored = cloudpickle.loads(cloudpickle.dumps(bound))
    assert restored.func is adaptive_run_evaluator  # imported by name in the worker
    assert restored.keywords == {"settings": SETTINGS, "best_s": 1e-4, "ledger": "x"}


@pytest.mark.slow
def test_tuning_with_the_adaptive_evaluator_records_tvm_format_and_its_cost(
    tiny_model, llvm_target, tmp_path
):
    from gradtune.measure.rpc_fleet import LocalFleet
    from gradtune.measure.runner import MeasureSettings
    from gradtune.partition import partition
    from gradtune.tune import count_records, run_database, tune

    _, tasks = partition(tiny_model.mod, tiny_model.params, llvm_target)
    with LocalFleet() as tracker:
        result = tune(tasks, llvm_target, tmp_path, tracker, max_trials=8, trials_per_round=4,
                      search="replay-trace", measure=MeasureSettings(mode="adaptive"))  # fmt: skip
    assert count_records(run_database(tmp_path)) == result.trials == 8
    lines = (tmp_path / "database_tuning_record.json").read_text().splitlines()
    measured = [json.loads(line)[1][1] for line in lines]  # [workload, [trace, run_secs, ...]]
    assert all(run_secs for run_secs in measured), "every candidate measured"
    for run_secs in measured:
        assert 1 <= len(run_secs) <= SETTINGS.max_batches
        assert all(0 < x < 1 for x in run_secs)
    cost = result.measure_cost
    assert cost.candidates == len(measured)
    assert cost.kernel_runs > cost.candidates * (1 + SETTINGS.min_batches)
    # Batches aim at 5 ms of device time each: at least 2 each, at most the cap's worth.
    assert 0 < cost.seconds < cost.candidates * (SETTINGS.max_batches + 2) * 0.1
    assert all(math.isfinite(us) for us in result.best_us.values()) and result.best_us


@pytest.mark.slow
def test_candidate_hanging_while_timed_is_an_error_and_the_batch_goes_on(tmp_path):
    """The RPC server ends a session after ``session_timeout_sec``, adaptive evaluator or not."""
    import tvm
    from tvm.s_tir import meta_schedule as ms
    from tvm.script import tirx as T

    from gradtune.measure.rpc_fleet import LocalFleet
    from gradtune.measure.runner import MeasureSettings, make_rpc_runner

    @T.prim_func(s_tir=True)
    def spin(a: T.Buffer((1,), "float32")):
        for _ in range(T.int64(1) << T.int64(40)):  # hours of dependent float operations
            with T.sblock("b"):
                a[0] = a[0] * T.float32(1.0000001) + T.float32(1.0)

    @T.prim_func(s_tir=True)
    def quick(a: T.Buffer((1,), "float32")):
        for _ in range(16):
            with T.sblock("b"):
                a[0] = a[0] + T.float32(1.0)

    inputs = []
    for func in (spin, quick):
        path = str(tmp_path / f"{len(inputs)}.so")
        tvm.compile(tvm.IRModule({"main": func}), target="llvm").export_library(path)
        args_info = ms.arg_info.ArgInfo.from_prim_func(func)
        inputs.append(ms.runner.RunnerInput(path, "cpu", args_info))
    with LocalFleet() as tracker:
        runner = make_rpc_runner(tracker, MeasureSettings(mode="adaptive", session_timeout_sec=5))
        try:
            hung, timed = [future.result() for future in runner.run(inputs)]
        finally:
            runner.pool.shutdown()
    assert hung.error_msg and hung.run_secs is None
    assert timed.error_msg is None and all(float(x) > 0 for x in timed.run_secs)
    assert runner.cost().candidates == 1  # the hung one left no ledger line
