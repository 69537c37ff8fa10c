"""bench/timing_position.py: identical work weighed by its place in a round, and bad input
refused in one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import BENCH, ROOT

sys.path.insert(0, str(BENCH))
import timing_position  # noqa: E402


def test_identical_copies_give_a_ratio_per_place_and_a_range_as_timed():
    row = timing_position.weigh(timing_position.numpy_matmul, "numpy", copies=2, timings=3)
    assert len(row["by_place"]) == 2 and row["by_place"][-1] == 1.0  # the last over itself
    lo, hi = row["as_timed_range"]
    assert 0 < lo <= row["as_timed_median"] <= hi


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--timings", "2"], "--timings must be at least 3"),
     (["--copies", "1"], "--copies must be at least 2")],
)  # fmt: skip
def test_bad_input_is_refused_in_one_line(args, message):
    result = subprocess.run(
        [sys.executable, str(BENCH / "timing_position.py"), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip() == f"timing_position: {message}"
