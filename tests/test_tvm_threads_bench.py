"""bench/tvm_threads.py refuses bad input in one line before it tunes anything."""

from __future__ import annotations

import pytest

from tests.conftest import assert_bench_refuses


@pytest.mark.parametrize(
    "args, says",
    [
        (["--models", "no/such/model.py"], "no such model file: no/such/model.py"),
        (["--repeats", "2"], "--repeats must be at least 3"),
    ],
)
def test_bad_input_is_refused_in_one_line_and_writes_nothing(tmp_path, args, says):
    assert_bench_refuses("tvm_threads.py", tmp_path, args, says)
