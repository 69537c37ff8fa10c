"""The descent's benchmarks (bench/descent_threads.py, bench/descent_speed.py) refuse bad
input in one line before they build anything."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import BENCH, ROOT


@pytest.mark.parametrize(
    ("script", "args", "says"),
    [
        ("descent_threads.py", ["--models", "small_cnn", "nothing"], "unknown model nothing"),
        ("descent_threads.py", ["--repeats", "2"], "--repeats must be at least 3"),
        ("descent_speed.py", ["--against", "HEAD", "--models", "nothing"], "unknown model nothing"),
        ("descent_speed.py", ["--against", "HEAD", "--repeats", "2"],
         "--repeats must be at least 3"),
        ("descent_speed.py", [], "--against REV is required"),
        ("descent_speed.py", ["--against", "no-such-commit"],
         "no-such-commit is not a commit of this repository"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_in_one_line(script, args, says):
    done = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and says in lines[0], done.stderr
    assert done.stdout == ""
