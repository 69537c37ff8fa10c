import math
import time

import pytest

from gradtune.partition import TuningTask, partition
from gradtune.tune import count_records, default_trials_per_round, estimate_model_us, run_database


def test_batch_size_leaves_room_for_every_task():
    assert default_trials_per_round(128, 6) == 8  # 10 would overshoot to 130 trials
    assert default_trials_per_round(120, 6) == 10
    assert default_trials_per_round(8, 2) == 2
    assert default_trials_per_round(10_000, 2) == 25  # capped at 32, then a divisor
    assert default_trials_per_round(127, 2) == 31  # prime: no divisor nearby, overshoot accepted


def test_estimate_uses_untuned_latency_until_a_task_is_measured():
    tasks = [TuningTask("a", None, 2, "x", 1.0, 10.0), TuningTask("b", None, 1, "y", 1.0, 5.0)]
    assert estimate_model_us(tasks, {}) == 25.0
    assert estimate_model_us(tasks, {"a": 3.0}) == 11.0
    assert estimate_model_us(tasks, {"a": math.inf}) == 25.0


@pytest.mark.slow
def test_a_programs_latency_is_the_median_of_its_run_secs_and_inf_when_it_failed():
    """One definition everywhere a run ranks programs (search, scheduler, cost model, report,
    transfer library): the median of the repeats, the middle two averaged for an even count
    (the adaptive evaluator's micro-batches); a failed candidate is infinitely slow."""
    import math

    from tvm.s_tir import meta_schedule as ms

    from gradtune.measure.latency import median_seconds, result_seconds

    assert median_seconds([3e-6, 1e-6, 2e-6]) == 2e-6
    assert median_seconds([1.0, 2.0, 4.0, 10.0]) == 3.0
    assert median_seconds([]) == median_seconds(None) == math.inf
    assert result_seconds(ms.runner.RunnerResult(run_secs=[1.0, 5.0, 2.0], error_msg=None)) == 2.0
    failed = ms.runner.RunnerResult(run_secs=None, error_msg="RuntimeError: ...")
    assert result_seconds(failed) == math.inf


def test_time_budget_stops_tuning_and_records_rounds(
    tiny_model, llvm_target, tmp_path, fleet, caplog
):
    import logging

    from gradtune.tune import tune

    _, tasks = partition(tiny_model.mod, tiny_model.params, llvm_target)
    rounds, starts = [], []
    # Time for the default schedules and some batches, not for 400 trials.
    with caplog.at_level(logging.INFO, logger="gradtune"):
        result = tune(tasks, llvm_target, tmp_path, fleet, max_trials=400, time_budget=20.0,
                      trials_per_round=4, on_start=starts.append,
                      on_round=rounds.append)  # fmt: skip
    assert starts == [0]
    assert result.stopped_by_time_budget
    assert 0 < result.trials < 400
    assert rounds == result.rounds and rounds[-1].trials == result.trials
    assert all(r.estimated_model_us > 0 for r in rounds)
    assert count_records(run_database(tmp_path)) == result.trials
    assert set(result.best_us) <= {t.name for t in tasks}
    # A Prefect worker has no terminal for the progress bar: each round is a line of its logs.
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("round ")]
    assert len(lines) == len(rounds)
    assert f"{rounds[-1].trials} trials" in lines[-1] and rounds[-1].task in lines[-1]


@pytest.mark.slow
def test_ctrl_c_swallowed_inside_tvm_still_stops_the_run(tiny_model, llvm_target, tmp_path):
    """Ctrl-C raised in a callback TVM calls can be caught on its way (a candidate marked
    failed, a sketch marked unmodelled); the run must still stop and report the interrupt."""
    import os
    import signal

    from gradtune.measure.rpc_fleet import LocalFleet
    from gradtune.tune import tune

    def swallow_ctrl_c(record):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)  # the handler runs here, in the main thread
        except KeyboardInterrupt:
            pass

    # Whatever handler the run found is the one it must leave (a background job inherits
    # SIG_IGN, a terminal gets Python's default).
    before = signal.getsignal(signal.SIGINT)
    _, tasks = partition(tiny_model.mod, tiny_model.params, llvm_target)
    with LocalFleet() as tracker, pytest.raises(KeyboardInterrupt):
        tune(tasks, llvm_target, tmp_path, tracker, max_trials=400, trials_per_round=4,
             on_round=swallow_ctrl_c)  # fmt: skip
    assert 0 < count_records(run_database(tmp_path)) < 400
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.slow
def test_default_schedules_are_measured_first_kept_on_resume_and_compile(
    tiny_model, llvm_target, tmp_path, fleet
):
    """Every task's default schedule is a measured record before the search starts (so the
    compiler never gets a program slower than untuned); a resumed run does not re-measure it;
    a database of defaults only compiles to a model with the reference's outputs."""
    from gradtune import compilation
    from gradtune.measure.baseline import is_default
    from gradtune.tune import tune

    fused, tasks = partition(tiny_model.mod, tiny_model.params, llvm_target)
    first = tune(tasks, llvm_target, tmp_path, fleet, max_trials=len(tasks))
    records = list(run_database(tmp_path).get_all_tuning_records())
    assert first.trials == len(records) == len(tasks)
    assert all(is_default(r) and r.run_secs for r in records)
    assert sorted(first.default_kept) == sorted(t.name for t in tasks)
    assert set(first.best_us) == {t.name for t in tasks}

    exe = compilation.build(fused, llvm_target, run_database(tmp_path))
    outputs = compilation.Runner(exe, llvm_target, tiny_model.inputs).outputs()
    compilation.verify(outputs, tiny_model.reference_outputs, "defaults-only build")

    again = tune(tasks, llvm_target, tmp_path, fleet, max_trials=len(tasks) + 4,
                 trials_per_round=2)  # fmt: skip
    records = list(run_database(tmp_path).get_all_tuning_records())
    assert sum(is_default(r) for r in records) == len(tasks)  # none measured twice
    assert again.resumed_trials == len(tasks) and len(records) == len(tasks) + again.trials
    import tvm_ffi

    defaults = {int(tvm_ffi.structural_hash(r.workload.mod)): r for r in records if is_default(r)}
    for task in tasks:  # a task's best is never slower than the default it competed with
        default = defaults[int(tvm_ffi.structural_hash(task.mod))]
        median_us = 1e6 * sorted(float(s) for s in default.run_secs)[len(default.run_secs) // 2]
        assert again.best_us[task.name] <= median_us


@pytest.mark.slow
def test_a_run_confirms_only_when_asked(tiny_model, llvm_target, tmp_path, fleet):
    """By default each task's recorded best ships; asked, the run re-times each task's few
    best quietly, ships the quietly fastest, and says so in ``best_us``."""
    from gradtune.measure.confirm import ACCOUNT_FILE
    from gradtune.tune import tune

    _, tasks = partition(tiny_model.mod, tiny_model.params, llvm_target)
    runs = {}
    # Unasked, nothing is confirmed whether a search ran or not: the defaults alone will do.
    runs["plain"] = tune(tasks, llvm_target, tmp_path / "plain", fleet, max_trials=len(tasks))
    runs["asked"] = tune(tasks, llvm_target, tmp_path / "asked", fleet,
                         max_trials=len(tasks) + 4, search="replay-trace",
                         trials_per_round=2, confirm_top_k=2)  # fmt: skip
    assert runs["plain"].confirmation is None
    assert not (tmp_path / "plain" / ACCOUNT_FILE).exists()
    confirmation = runs["asked"].confirmation
    assert confirmation is not None and (tmp_path / "asked" / ACCOUNT_FILE).is_file()
    for c in confirmation.tasks:
        assert runs["asked"].best_us[c.task] == c.quiet_us[c.winner]
        if c.default is not None:  # timed again quietly beside the others: compared so
            assert c.quiet_us[c.winner] <= c.quiet_us[c.default]
