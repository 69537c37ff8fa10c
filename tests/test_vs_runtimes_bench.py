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


def test_a_model_tuned_with_defaults_that_moved_since_is_not_finished(tmp_path, bench_on_path):
    """The benchmark tunes with the CLI's defaults: a result whose gradient search ran with
    defaults that have moved since (structural_variants went from 0 to 3) is tuned again, not
    kept beside results of today's; one recorded before results named it cannot be told."""
    import vs_runtimes
    from searchbench.layout import today_defaults, write_json
    from searchbench.models import MODELS

    bench = MODELS["mbconv_se"]
    record = {"budget_s": 480.0, "trials_budget": 5000, "source_sha1": bench.source_sha1(),
              "timing": {"state": "near"}}  # fmt: skip
    path = vs_runtimes.result_path(tmp_path, bench.name)
    for config, finished in [(today_defaults(), True), (None, True),
                             ({**today_defaults(), "structural_variants": 0}, False)]:  # fmt: skip
        write_json(path, {**record, "gradient_config": config})
        assert vs_runtimes.finished(tmp_path, bench, 480.0, 5000) is finished, config


def test_a_model_timed_with_the_cores_apart_is_timed_again(tmp_path, bench_on_path):
    """A result timed while the cores sat apart (gradtune.crosscore) in fewer attempts than
    TIMING_ATTEMPTS, or before the probe, is not finished: the next run times it again."""
    import vs_runtimes
    from searchbench.layout import today_defaults, write_json
    from searchbench.models import MODELS

    bench = MODELS["bert_block"]
    record = {"budget_s": 480.0, "trials_budget": 5000, "source_sha1": bench.source_sha1(),
              "gradient_config": today_defaults()}  # fmt: skip
    path = vs_runtimes.result_path(tmp_path, bench.name)
    for timing, finished in [
        ({"timing": {"state": "near"}, "timing_attempts": 1}, True),
        ({"timing": {"state": "apart"}, "timing_attempts": 1}, False),
        ({"timing": {"state": "apart"}, "timing_attempts": vs_runtimes.TIMING_ATTEMPTS}, True),
        ({}, False),  # before the probe
    ]:
        write_json(path, {**record, **timing})
        assert vs_runtimes.finished(tmp_path, bench, 480.0, 5000) is finished, timing
