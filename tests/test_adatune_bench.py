"""bench/adatune_ablation.py: bad input refused before anything starts; its plan and metrics."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import assert_bench_refuses

pytestmark = pytest.mark.usefixtures("bench_on_path")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--models", "dcgan_like", "no_such_model"], "unknown model no_such_model"),
        (["--configs", "baseline", "nothing"], "unknown configuration nothing"),
        (["--repeats", "0"], "--repeats at least 1"),
    ],
)
def test_bad_input_is_one_line_before_anything_starts(tmp_path, args, says):
    assert_bench_refuses("adatune_ablation.py", tmp_path, args, says)


def test_plan_runs_every_configuration_once_per_model_and_repeat_rotating_the_first():
    from adatunebench.layout import CONFIGS, plan

    configs = list(CONFIGS)
    runs = plan(["a", "b", "c"], 3, configs)
    keys = [(c, s.model, s.repeat) for c, s in runs]
    assert len(set(keys)) == len(keys) == 3 * 3 * len(configs)
    firsts = [runs[i][0] for i in range(0, len(runs), len(configs))]
    assert len(set(firsts)) >= 3, "no configuration always goes first"


def test_evolutionary_rows_run_metaschedules_search_scored_by_its_xgboost_or_the_ensemble():
    from adatunebench.layout import CONFIGS, layout_of, plan

    runs = plan(["a"], 1, ["baseline", "evolutionary", "evolutionary_ensemble"])
    assert {c: s.searcher for c, s in runs} == {
        "baseline": "gradient", "evolutionary": "evolutionary",
        "evolutionary_ensemble": "evolutionary",
    }  # fmt: skip
    assert [layout_of(Path("w"), 300, c).scheduler_model() for c in CONFIGS].count("xgb") == 6
    ensemble = layout_of(Path("w"), 300, "evolutionary_ensemble")
    assert ensemble.scheduler_model() == "ensemble" and ensemble.prepares_ensemble()


def _finish(layout, model: str, repeat: int, rounds: list, measure_s: float, trials: int) -> None:
    from searchbench.layout import RunSpec, write_json

    spec = RunSpec(model, "gradient", repeat)
    write_json(layout.result(spec), {
        "run_id": spec.run_id, "model": model, "repeat": repeat, "overrun_pct": 1.0,
        "rounds": [{"wall_s": t, "estimated_us": us, "trials": i} for i, (t, us) in
                   enumerate(rounds)],
        "trials_in_budget": trials, "measure_seconds": measure_s, "measured_candidates": trials,
        "commit": "abc1234",
    })  # fmt: skip


def test_metrics_compare_each_configuration_with_the_baseline(tmp_path: Path):
    from adatunebench import analysis
    from adatunebench.layout import BASELINE, FULL, layout_of, plan
    from searchbench.layout import write_json

    configs = [BASELINE, FULL, "adaptive_only"]
    layouts = {c: layout_of(tmp_path, 100.0, c) for c in configs}
    runs = plan(["m"], 1, configs)
    # The baseline ends at 500 µs, reached at 80 s; full gets there at 20 s and on to 480.
    _finish(layouts[BASELINE], "m", 0, [(10, 900), (80, 500)], measure_s=8.0, trials=100)
    _finish(layouts[FULL], "m", 0, [(10, 700), (20, 500), (60, 480)], measure_s=3.0, trials=150)
    _finish(layouts["adaptive_only"], "m", 0, [(30, 600), (150, 400)], measure_s=2.0, trials=50)
    write_json(layouts[BASELINE].timing("m"), {"ms": {
        "baseline/gradient-r0@100": 2.0, "full/gradient-r0@100": 1.9,
    }})  # fmt: skip
    data = analysis.gather(layouts, runs, ["m"])
    rows = data["models"]["m"]["configs"]
    assert data["models"]["m"]["best_known_us"] == 480 and not data["partial"]
    # 95% of 480 µs is 505 µs: the baseline reached it at 80 s, full at 20 s; adaptive_only
    # only after the budget (150 s > 100 s), a bound.
    assert rows[BASELINE]["t95_s"] == 80 and rows[FULL]["t95_s"] == 20
    assert rows["adaptive_only"]["t95_bound"] and rows["adaptive_only"]["t95_s"] == 100
    assert rows[FULL]["t_baseline_final_s"] == 20
    assert rows[BASELINE]["measure_s_per_trial"] == pytest.approx(0.08)
    summary = analysis.summary_line(data, None)
    assert summary["measure_seconds_ratio"] == pytest.approx(0.08 / 0.04)
    assert summary["measure_seconds_ratio_of"] == "baseline / adaptive_only"
    two = configs[:2]  # without the evaluator alone, full's adaptive timing stands in, named
    partial = analysis.gather({c: layouts[c] for c in two}, plan(["m"], 1, two), ["m"])
    fallback = analysis.summary_line(partial, None)
    assert fallback["measure_seconds_ratio"] == pytest.approx(0.08 / 0.02)
    assert fallback["measure_seconds_ratio_of"] == "baseline / full"
    assert summary["t95_ratio_full_over_baseline"] == pytest.approx(0.25)
    assert summary["final_latency_ratio"] == pytest.approx(0.95)
    text = analysis.markdown(data, summary, configs)
    assert "| m | adaptive_only | 1 | > 100.0 |" in text
    assert analysis.plot(data, layouts, runs, tmp_path / "out" / "ablation")[0].is_file()


def test_the_wall_clock_splits_into_choosing_building_and_measuring_and_device_timing():
    """The adaptive evaluator shortens only the device's share: the report shows how much of a
    run that is beside the search's own share."""
    from adatunebench.analysis import wall_shares

    rounds = [{"search": {"search_s": 30.0, "measure_s": 40.0}},
              {"search": {"search_s": 10.0, "measure_s": 20.0}}, {"wall_s": 90.0}]  # fmt: skip
    shares = wall_shares({"wall_s": 100.0, "measure_seconds": 5.0, "rounds": rounds})
    assert shares == pytest.approx(
        {"search_share": 0.4, "build_measure_share": 0.6, "device_share": 0.05}
    )
    assert wall_shares({"wall_s": 100.0, "rounds": [{"wall_s": 9.0}]})["search_share"] is None


def test_a_configuration_whose_defaults_moved_since_its_runs_is_refused(tmp_path: Path):
    """A configuration names only its overrides: a default that moved since its finished runs
    would make its next runs another search under the same name. Refused in one line, before
    anything is prepared."""
    import subprocess
    import sys

    from adatunebench.layout import layout_of
    from searchbench.layout import RunSpec, write_json

    from tests.conftest import BENCH, ROOT

    layout = layout_of(tmp_path, 300, "baseline")
    before = {**layout.gradient_effective(), "structural_variants": 0}
    write_json(layout.result(RunSpec("bert_block", "gradient", 0)),
               {"gradient_config_effective": before})  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(BENCH / "adatune_ablation.py"), "--work", str(tmp_path),
         "--out", str(tmp_path / "out"), "--models", "bert_block", "--configs", "baseline"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "bert_block gradient runs of another configuration: structural_variants=0" in lines[0]
    assert not (tmp_path / "out").exists() and not layout.prepared("bert_block").exists()


def test_finished_runs_go_to_an_archive_per_configuration_and_come_back(tmp_path: Path, capsys):
    """The ablation outlasts a session's machine: its finished runs are carried in git and put
    back, each configuration's into its own layout; one the archive lacks is named, not an
    error, so the archive can grow by configurations."""
    import json

    import adatune_ablation
    from adatunebench.layout import layout_of
    from searchbench import api
    from searchbench.layout import RunSpec

    config, _ = api.host_target()
    work, archive = tmp_path / "work", tmp_path / "archive"
    spec = RunSpec("bert_block", "gradient", 0)
    result = {"model": "bert_block", "run_id": "gradient-r0", "target": config, "builds": {}}
    baseline = layout_of(work, 300, "baseline")
    baseline.result(spec).parent.mkdir(parents=True)
    baseline.result(spec).write_text(json.dumps(result))
    common = ["--work", str(work), "--out", str(tmp_path / "out"), "--configs", "baseline", "full"]

    assert adatune_ablation.main([*common, "--archive", str(archive)]) == 0
    assert json.loads((archive / "baseline/runs/bert_block/gradient-r0/result.json").read_text())
    assert not (archive / "full").exists()

    baseline.result(spec).unlink()
    assert adatune_ablation.main([*common, "--restore", str(archive)]) == 0
    assert json.loads(baseline.result(spec).read_text()) == result
    assert not layout_of(work, 300, "full").finished(spec)
    assert "full: not in" in capsys.readouterr().out
