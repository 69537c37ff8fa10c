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
def test_time_budget_stops_tuning_and_records_rounds(tiny_model, llvm_target, tmp_path):
    from gradtune.measure.rpc_fleet import LocalFleet
    from gradtune.tune import tune

    _, tasks = partition(tiny_model.mod, tiny_model.params, llvm_target)
    rounds, starts = [], []
    with LocalFleet() as tracker:
        result = tune(tasks, llvm_target, tmp_path, tracker, max_trials=400, time_budget=1.0,
                      trials_per_round=4, on_start=starts.append,
                      on_round=rounds.append)  # fmt: skip
    assert starts == [0]
    assert result.stopped_by_time_budget
    assert 0 < result.trials < 400
    assert rounds == result.rounds and rounds[-1].trials == result.trials
    assert all(r.estimated_model_us > 0 for r in rounds)
    assert count_records(run_database(tmp_path)) == result.trials
    assert set(result.best_us) <= {t.name for t in tasks}


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
