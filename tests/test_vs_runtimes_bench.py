"""bench/vs_runtimes.py --render: gathers what finished and tunes nothing."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import BENCH, ROOT


def test_render_tunes_nothing_and_marks_a_partial_result(tmp_path):
    done = subprocess.run(
        [sys.executable, str(BENCH / "vs_runtimes.py"), "--render", "--work", str(tmp_path / "w"),
         "--out", str(tmp_path / "out"), "--models", "mbconv_se", "unet_small"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "w" / "runs").exists()  # no model was tuned
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "models": {},
        "geomean_vs_ort": None,
    }
    text = (tmp_path / "out" / "vs_runtimes.md").read_text()
    assert text.startswith("# gradtune against what you would deploy instead (PARTIAL)")
    assert json.loads((tmp_path / "out" / "vs_runtimes.json").read_text())["partial"] is True
