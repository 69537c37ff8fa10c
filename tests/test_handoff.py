"""``--measure handoff``: candidates timed singly, each right after the pool rewrote its first
argument, through a real local RPC fleet; the rewrite keeps the argument's values."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gradtune.measure.adaptive import HANDOFF, read_ledger
from gradtune.measure.handoff import RUNS_PER_GROUP, group_medians, rewrite_first_arg


def test_group_medians_are_taken_over_consecutive_runs():
    runs = [1.0, 9.0, 2.0, 5.0, 5.0, 6.0, 3.0, 3.0, 30.0]
    assert group_medians(runs, 3) == [2.0, 5.0, 3.0]
    assert group_medians([4.0, 1.0], 1) == [2.5]


@pytest.mark.parametrize("dtype", ["float32", "float16", "int64", "uint8"])
def test_rewriting_the_first_argument_keeps_its_bytes(dtype):
    import tvm

    rng = np.random.default_rng(0)
    values = (rng.standard_normal((3, 37, 5)) * 100).astype(dtype)  # odd byte counts too
    first = tvm.runtime.tensor(values, tvm.cpu(0))
    other = tvm.runtime.tensor(values.copy(), tvm.cpu(0))
    rewrite_first_arg(first, other)
    np.testing.assert_array_equal(first.numpy(), values)
    np.testing.assert_array_equal(other.numpy(), values)


def test_a_gpu_target_is_refused_in_one_line(tmp_path):
    from gradtune.errors import GradtuneError
    from gradtune.job import make_job

    model = tmp_path / "m.py"
    model.write_text("")  # the flow's job checks the file's name here, not its contents
    with pytest.raises(GradtuneError, match="--measure handoff times CPU kernels only"):
        make_job(target="cuda", model=str(model), measure="handoff")


@pytest.mark.slow
def test_tuning_with_handoff_records_tvm_format_and_its_runs(tiny_model, llvm_target, tmp_path):
    from gradtune.measure.rpc_fleet import LocalFleet
    from gradtune.measure.runner import MeasureSettings
    from gradtune.partition import partition
    from gradtune.tune import count_records, run_database, tune

    _, tasks = partition(tiny_model.mod, tiny_model.params, llvm_target)
    settings = MeasureSettings(mode=HANDOFF)
    with LocalFleet() as tracker:
        result = tune(tasks, llvm_target, tmp_path, tracker, max_trials=6, trials_per_round=3,
                      search="replay-trace", measure=settings)  # fmt: skip
    assert count_records(run_database(tmp_path)) == result.trials == 6
    lines = (tmp_path / "database_tuning_record.json").read_text().splitlines()
    measured = [json.loads(line)[1][1] for line in lines]  # [workload, [trace, run_secs, ...]]
    assert all(len(run_secs) == settings.repeat for run_secs in measured), measured
    assert all(0 < float(x) < 1 for run_secs in measured for x in run_secs)
    cost = result.measure_cost
    assert cost.candidates == len(measured)
    assert cost.kernel_runs == cost.candidates * settings.repeat * RUNS_PER_GROUP
    assert 0 < cost.seconds < cost.candidates * 0.5
    assert result.best_us


def test_ledger_counts_handoff_timings_as_neither_slow_nor_unconverged(tmp_path):
    from gradtune.measure.adaptive import Timing, write_ledger

    ledger = str(tmp_path / "ledger.jsonl")
    write_ledger(ledger, Timing([1e-5, 1e-5, 1e-5], 45, 4.5e-4, HANDOFF))
    cost = read_ledger(ledger)
    assert (cost.candidates, cost.kernel_runs, cost.unconverged, cost.slow) == (1, 45, 0, 0)
