"""bench/record_fidelity.py: its per-task statistics, and bad input refused in one line."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import ROOT, assert_bench_refuses

sys.path.insert(0, str(ROOT / "bench"))
import record_fidelity  # noqa: E402


def _plan(recorded: list[float]) -> dict:
    return {
        "threads": 2,
        "programs": [
            {"task": "w1", "lib": f"p{i}.so", "args": [], "recorded_s": r}
            for i, r in enumerate(recorded)
        ],
    }


def test_a_run_that_recorded_each_program_twice_as_slow_in_order_is_inflated_not_misordered():
    quiet = [1e-5 * (i + 1) for i in range(20)]
    passes = [{f"p{i}.so": q * (1 + 0.001 * k) for i, q in enumerate(quiet)} for k in range(3)]
    row = record_fidelity.task_rows(_plan([2 * q for q in quiet]), passes)["w1"]
    assert row["inflation_median"] == pytest.approx(2.0, rel=0.01)
    assert row["spearman"] == pytest.approx(1.0) and row["top_spearman"] == pytest.approx(1.0)
    assert row["n"] == 20 and row["quiet_best_us"] == pytest.approx(10.0, rel=0.01)


def test_a_run_whose_recorded_order_among_the_fastest_is_reversed_is_caught():
    quiet = [1e-5 * (i + 1) for i in range(20)]
    passes = [{f"p{i}.so": q for i, q in enumerate(quiet)} for _ in range(3)]
    recorded = [quiet[record_fidelity.TOP - 1 - i] for i in range(record_fidelity.TOP)]
    recorded += quiet[record_fidelity.TOP :]
    row = record_fidelity.task_rows(_plan(recorded), passes)["w1"]
    assert row["top_spearman"] == pytest.approx(-1.0)
    assert row["top_noise_floor"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    "args, says",
    [
        ([], "name at least one run database"),
        (["no/such/run"], "no/such/run holds no database_tuning_record.json"),
    ],
)
def test_bad_input_is_refused_in_one_line_and_writes_nothing(tmp_path, args, says):
    assert_bench_refuses("record_fidelity.py", tmp_path, args, says)
