"""bench/vm_exec.py: a run's model built with the VM interpreted and compiled, the same
outputs checked, both timed side by side; bad input refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict

import pytest

from tests.conftest import BENCH, EXAMPLES, ROOT

pytestmark = pytest.mark.usefixtures("bench_on_path")


def _run_dir(tmp_path):
    """A tune out directory as ``vm_exec`` reads it: ``run.json`` and an empty database (every
    kernel at its default schedule)."""
    from gradtune.partition import Lowering
    from gradtune.target import parse_target

    run = tmp_path / "run"
    run.mkdir()
    record = {"model": str(EXAMPLES / "small_cnn.py"), "entry": "tiny_mlp",
              "target": parse_target(None), "lowering": asdict(Lowering())}  # fmt: skip
    (run / "run.json").write_text(json.dumps(record))
    for name in ("database_workload.json", "database_tuning_record.json"):
        (run / name).write_text("")
    return run


def test_both_builds_are_timed_side_by_side_and_written(tmp_path, capsys):
    from vm_exec import main

    run = _run_dir(tmp_path)
    assert main([str(run), "--rounds", "7", "--out", str(tmp_path / "out")]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    row = result["libraries"]["run"]
    assert row["bytecode_us"] > 0 and row["compiled_us"] > 0
    lo, hi = row["ratio_range"]
    assert lo <= row["bytecode_over_compiled"] <= hi
    assert result["geomean_bytecode_over_compiled"] == pytest.approx(row["bytecode_over_compiled"])
    assert json.loads((tmp_path / "out" / "vm_exec.json").read_text()) == result


@pytest.mark.parametrize(
    "args, says",
    [
        (["no/such/run"], "no/such/run has no run.json"),
        (["RUN", "--rounds", "3"], "--rounds must be at least 7"),
    ],
)
def test_bad_input_is_refused_in_one_line(tmp_path, args, says):
    run = _run_dir(tmp_path)
    args = [str(run) if a == "RUN" else a for a in args]
    done = subprocess.run(
        [sys.executable, str(BENCH / "vm_exec.py"), *args],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr
