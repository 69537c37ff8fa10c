"""bench/descent_speed.py refuses bad input in one line before it builds anything."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import BENCH, ROOT


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--against", "HEAD", "--models", "nothing"], "unknown model nothing"),
        (["--against", "HEAD", "--repeats", "2"], "--repeats must be at least 3"),
        ([], "--against REV is required"),
        (["--against", "no-such-commit"], "no-such-commit is not a commit of this repository"),
    ],
)
def test_bad_input_is_refused_in_one_line(args, says):
    done = subprocess.run(
        [sys.executable, str(BENCH / "descent_speed.py"), *args],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and says in lines[0], done.stderr
    assert done.stdout == ""
