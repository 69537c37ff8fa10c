"""bench/search_efficiency.py --kernels and --versus: what they report, and bad input."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import BENCH, ROOT

pytestmark = pytest.mark.usefixtures("bench_on_path")


def test_kernels_of_a_model_without_runs_is_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, str(BENCH / "search_efficiency.py"), "--work", str(tmp_path),
         "--budget", "480", "--kernels", "bert_block"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode != 0
    where = tmp_path / "480s"
    assert done.stderr.strip() == f"search_efficiency: no finished runs of bert_block in {where}"


@pytest.mark.parametrize(
    ("config", "says"),
    [
        (["--versus", "bert_block"], "--versus compares a --gradient-config"),
        (
            ["--versus", "bert_block", "--gradient-config", "evolutionary_explore=True"],
            "(--budget 480; layouts here have budgets none)",
        ),
        (
            [
                "--versus",
                "bert_block",
                "--gradient-config",
                "explorer_every=2",
                "--against",
                "ranked_warmup=0",
            ],
            "no finished runs of bert_block in",
        ),
        (["--against", "ranked_warmup=0"], "--against weighs a configuration in a --versus"),
        (
            ["--warmup", "random"],
            "unknown --warmup 'random'; choose one of model, stake, fresh, skip",
        ),
    ],
)
def test_versus_without_an_ablation_or_runs_is_one_line(tmp_path, config, says):
    done = subprocess.run(
        [sys.executable, str(BENCH / "search_efficiency.py"), "--work", str(tmp_path),
         "--budget", "480", *config],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr


def test_versus_at_a_budget_without_runs_names_the_budgets_that_have_them(tmp_path):
    (tmp_path / "300s" / "runs" / "bert_block").mkdir(parents=True)
    (tmp_path / "300s-steps=64" / "runs").mkdir(parents=True)
    done = subprocess.run(
        [sys.executable, str(BENCH / "search_efficiency.py"), "--work", str(tmp_path),
         "--budget", "480", "--gradient-config", "steps=64", "--versus", "bert_block"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"search_efficiency: no finished runs of bert_block in {tmp_path / '480s'} "
        "(--budget 480; layouts here have budgets 300)"
    )


def test_best_found_by_credits_the_side_whose_batch_first_reached_each_tasks_best():
    from searchbench.analysis import best_found_by

    def batch(
        task: str,
        descent: float,
        explorer: float,
        sampled: bool = False,
        ranked: bool = False,
        variants: float | None = None,
    ) -> dict:
        search = {"descent_best_us": descent, "evolved_best_us": explorer, "sampled": sampled,
                  "ranked": ranked}  # fmt: skip
        if variants is not None:
            search["structural_best_us"] = variants
        return {"task": task, "search": search}

    inf = float("inf")
    rounds = [
        batch("conv", 10.0, 8.0),  # the explorer first ...
        batch("dense", 3.0, inf),  # a batch with no explorer picks
        batch("conv", 7.0, 9.0),  # ... then the descent beats it
        batch("dense", 4.0, 3.0),  # a tie is not an improvement: the descent keeps it
        {"task": "pool"},  # a task the gradient search handed to evolutionary search
    ]
    counts = {"descent": 2, "explorer": 0, "random": 0, "ranked": 0, "structural": 0}
    assert best_found_by({"rounds": rounds}) == counts
    rounds.append(batch("conv", 9.0, 6.5))
    counts |= {"descent": 1, "explorer": 1}
    assert best_found_by({"rounds": rounds}) == counts
    # a first batch whose explore share was drawn at random (random_warmup)
    rounds.insert(0, batch("pool", 5.0, 2.0, sampled=True))
    assert best_found_by({"rounds": rounds}) == counts | {"random": 1}
    # ... and one whose draws were ranked by the task scheduler's model (ranked_warmup)
    rounds.insert(0, batch("relu", 5.0, 1.0, sampled=True, ranked=True))
    assert best_found_by({"rounds": rounds}) == counts | {"random": 1, "ranked": 1}
    # a structural variant among the descent's picks reached the batch's best: its credit
    rounds.append(batch("dense", 2.0, inf, variants=2.0))
    rounds.append(batch("relu", 0.9, inf, variants=1.5))  # the descent's own pick was faster
    counts |= {"descent": 1, "structural": 1}
    assert best_found_by({"rounds": rounds}) == counts | {"random": 1, "ranked": 0}
    assert best_found_by({"rounds": [{"task": "conv"}]}) is None  # an evolutionary run


def test_timing_is_redone_when_a_library_under_a_timed_label_changes(tmp_path):
    """A run redone, or moved in from another layout under the same label, is timed again:
    a timing record covers each library by size and modification time, not by label."""
    import json
    import os

    from searchbench.layout import Layout, write_json
    from searchbench.timing import PASSES, identities, libraries, up_to_date

    layout = Layout(tmp_path, 480.0)
    run = layout.root / "runs" / "bert_block" / "gradient-r0"
    run.mkdir(parents=True)
    result = {"run_id": "gradient-r0", "builds": {"100": {"library": "model_at_100.so"}}}
    (run / "result.json").write_text(json.dumps(result))
    library = run / "model_at_100.so"
    library.write_bytes(b"old run")
    assert not up_to_date(layout, "bert_block"), "never timed"
    found = libraries(layout, "bert_block")
    assert list(found) == ["gradient-r0@100"]
    record = {"ms": {"gradient-r0@100": 0.04}, "libraries": identities(found)}
    write_json(layout.timing("bert_block"), record)
    assert not up_to_date(layout, "bert_block"), "one pass (an older record) is timed again"
    record["passes"] = [record["ms"]] * PASSES
    write_json(layout.timing("bert_block"), record)
    assert not up_to_date(layout, "bert_block"), "no cross-core state: from before the probe"
    record["state"] = "near"
    write_json(layout.timing("bert_block"), record)
    assert up_to_date(layout, "bert_block")
    library.write_bytes(b"another run's library")
    os.utime(library, ns=(1, 1))
    assert not up_to_date(layout, "bert_block"), "same label, another library"
    write_json(layout.timing("bert_block"), {"ms": {"gradient-r0@100": 0.04}})
    assert not up_to_date(layout, "bert_block"), "a record without identities vouches for nothing"


def test_timing_passes_are_grouped_by_the_cross_core_state_of_all_passes():
    """A pass wholly apart reads steady on its own; against the fastest probe of all passes
    it is APART, kept out of the NEAR passes; a pass whose state moved throughout is MOVED."""
    from searchbench.timing import by_state

    from gradtune.compilation import Timing
    from gradtune.crosscore import APART, MOVED, NEAR

    near = Timing({"lib": [1.0, 1.1, 1.0]}, [800.0, 790.0, 810.0, 805.0])
    apart = Timing({"lib": [1.7, 1.8, 1.7]}, [1600.0, 1610.0, 1590.0, 1620.0])
    moved = Timing({"lib": [1.0, 1.8]}, [800.0, 1600.0, 800.0])
    grouped = by_state([near, apart, moved])
    assert grouped == {NEAR: [{"lib": 1.0}], APART: [{"lib": 1.7}], MOVED: [{"lib": 1.4}]}
    assert by_state([apart]) == {NEAR: [{"lib": 1.7}]}, "alone, its own fastest is near"


def test_end_to_end_ratio_is_taken_within_each_timing_pass():
    """One library's latency can move by tens of percent between timing passes of one process:
    the ratio at the budget is the median of the ratios within each pass (here 2.0), not the
    ratio of medians over passes (1.5); each library's ms is its median over the passes."""
    from searchbench.analysis import analyse_model

    def run(searcher: str) -> dict:
        return {
            "run_id": f"{searcher}-r0", "searcher": searcher, "repeat": 0,
            "rounds": [{"task": "conv", "wall_s": 10.0, "estimated_us": 100.0}],
            "builds": {k: {"records": 1} for k in ("25", "50", "100")},
            "trials_in_budget": 8, "wall_s": 100.0, "overrun_pct": 0.0, "per_round": 8,
        }  # fmt: skip

    passes = [
        {"gradient-r0@100": 1.0, "evolutionary-r0@100": 2.0},
        {"gradient-r0@100": 2.0, "evolutionary-r0@100": 3.0},
        {"gradient-r0@100": 3.0, "evolutionary-r0@100": 10.0},
    ]
    results = [run("gradient"), run("evolutionary")]
    m = analyse_model(results, results, passes, budget=100.0)
    assert m["e2e_ratio_at_budget"] == 2.0
    assert m["e2e_ratio_at_budget_passes"] == [1.5, 3.333]
    assert m["searchers"]["gradient"]["e2e_ms_median"]["100"] == 2.0  # per library: median
    assert m["searchers"]["evolutionary"]["e2e_ms_median"]["100"] == 3.0
    assert m["e2e_ratio"]["25"] is None, "no library at a quarter: no ratio"


def test_milestones_are_felixs_90_95_99_percent_of_the_best_known():
    """The time each searcher needs to come within 90/95/99% of the best any run reached, as
    Felix's Table 2 reports it; a searcher that never got there gives a bound, marked."""
    from searchbench.analysis import analyse_model

    def run(searcher: str, rounds: list[tuple[float, float]]) -> dict:
        return {
            "run_id": f"{searcher}-r0", "searcher": searcher, "repeat": 0,
            "rounds": [{"task": "conv", "wall_s": t, "estimated_us": us} for t, us in rounds],
            "builds": {}, "trials_in_budget": 8, "wall_s": 100.0, "overrun_pct": 0.0,
            "per_round": 8,
        }  # fmt: skip

    results = [
        run("gradient", [(10.0, 110.0), (40.0, 100.0)]),
        run("evolutionary", [(50.0, 104.0)]),
    ]
    m = analyse_model(results, results, [], budget=100.0)
    assert m["best_estimated_us"] == 100.0
    ms = m["milestones"]
    assert (ms["90"]["ratio"], ms["90"]["kind"]) == (5.0, "=")  # 10 s against 50 s
    assert (ms["95"]["ratio"], ms["95"]["kind"]) == (1.25, "=")  # 40 s against 50 s
    assert ms["99"]["kind"] == "≥" and ms["99"]["evolutionary_reached"] == "0/1"
    assert ms["95"]["ratio"] == m["t95_ratio"]


def test_a_layout_refuses_new_gradient_runs_of_another_configuration_than_its_own(tmp_path):
    """A default that moved since a layout's gradient runs were made (ranked_warmup went from 0
    to 256, structural_variants from 0 to 3) would mix two searches under one name: resuming is
    refused in one line naming the field, before any run starts; runs recorded with today's
    configuration pass."""
    import json

    from searchbench.layout import Layout, RunSpec

    layout = Layout(tmp_path, 480.0)
    now = layout.gradient_effective()
    assert now["ranked_warmup"] == 256
    pending = [RunSpec("bert_block", "gradient", 1)]  # the run a resume would make
    result = layout.result(RunSpec("bert_block", "gradient", 0))
    result.parent.mkdir(parents=True)
    result.write_text(json.dumps({"gradient_config_effective": now}))
    assert layout.mixed_config(pending, ("gradient",)) is None
    result.write_text(json.dumps({"gradient_config_effective": {**now, "ranked_warmup": 0}}))
    assert "ranked_warmup=0 (now 256)" in layout.mixed_config(pending, ("gradient",))
    assert Layout(tmp_path, 480.0, "ranked_warmup=0").mixed_config(pending, ("gradient",)) is None
    # A record from before a field existed searched with the field's first default: 0 for
    # structural_variants (today 3), today's for a field whose default never moved.
    newer = ("structural_variants", "explorer_time_share")
    older = {k: v for k, v in now.items() if k not in newer}
    result.write_text(json.dumps({"gradient_config_effective": older}))
    assert "structural_variants=0 (now 3)" in layout.mixed_config(pending, ("gradient",))
    assert "explorer_time_share" not in layout.mixed_config(pending, ("gradient",))
    pinned = Layout(tmp_path, 480.0, "structural_variants=0")
    assert pinned.mixed_config(pending, ("gradient",)) is None
    done = subprocess.run(
        [sys.executable, str(BENCH / "search_efficiency.py"), "--work", str(tmp_path),
         "--budget", "480", "--models", "bert_block"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "bert_block gradient runs of another configuration: structural_variants=0" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["480s"]  # nothing prepared


def test_an_ablation_equal_to_the_defaults_is_refused_before_any_run(tmp_path):
    """A --gradient-config that spells today's defaults (steps=64 after the flip) would tune the
    default layout's runs again under another name: refused in one line before anything is
    prepared; its finished runs, made while it was an ablation, still render."""
    from searchbench.layout import Layout, RunSpec

    from gradtune.search.gradient_search import GradientConfig

    default = f"steps={GradientConfig().steps}"
    pending = [RunSpec("bert_block", "evolutionary", 0), RunSpec("bert_block", "gradient", 0)]
    same = Layout(tmp_path, 480.0, default)
    assert "is the gradient search's default configuration" in same.redundant_config(pending)
    assert Layout(tmp_path, 480.0, "steps=16").redundant_config(pending) is None
    assert Layout(tmp_path, 480.0).redundant_config(pending) is None
    same.result(pending[1]).parent.mkdir(parents=True)
    same.result(pending[1]).write_text("{}")
    assert same.redundant_config(pending) is None  # only the adopted peer is left to make
    done = subprocess.run(
        [sys.executable, str(BENCH / "search_efficiency.py"), "--work", str(tmp_path / "w"),
         "--budget", "480", "--models", "bert_block", "--gradient-config", default],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0] == (
        f"search_efficiency: --gradient-config {default} is the gradient search's default "
        "configuration now; run without --gradient-config"
    )
    assert not (tmp_path / "w").exists() or not any((tmp_path / "w").rglob("*.json"))


@pytest.mark.parametrize(
    ("script", "results"),
    [("search_efficiency", "300s/results"), ("vs_runtimes", "results"), ("lowering", "results"),
     ("transfer_tuning", "results"), ("adatune_ablation", "results")],
)  # fmt: skip
def test_results_follow_a_work_dir_of_its_own(tmp_path, script, results):
    """Only the default work directory renders into the committed bench/results/: a trial
    elsewhere once overwrote them."""
    import importlib

    module = importlib.import_module(script)
    assert module.parse_args(["--work", str(tmp_path)]).out == tmp_path / results
    assert module.parse_args([]).out == BENCH / "results"
    chosen = tmp_path / "elsewhere"
    assert module.parse_args(["--work", str(tmp_path), "--out", str(chosen)]).out == chosen


def test_search_results_of_two_budgets_in_one_work_dir_render_apart(tmp_path):
    """A 1440 s render once overwrote the 480 s one of the same work directory."""
    from search_efficiency import parse_args

    at = {b: parse_args(["--work", str(tmp_path), "--budget", b]).out for b in ("480", "1440")}
    assert at == {"480": tmp_path / "480s" / "results", "1440": tmp_path / "1440s" / "results"}


def test_an_ablation_adopts_the_default_configurations_finished_evolutionary_runs(tmp_path):
    """An ablation changes only the gradient search: its layout copies in the default layout's
    finished evolutionary run (same budget and measurement), whole, replacing a half-finished
    one of its own; never a gradient run, an unfinished one, or one of another measurement."""
    import json

    from searchbench.layout import Layout, RunSpec

    evo, grad = RunSpec("bert_block", "evolutionary", 1), RunSpec("bert_block", "gradient", 1)
    default, ablation = Layout(tmp_path, 480.0), Layout(tmp_path, 480.0, "steps=32")
    assert ablation.adopt(evo) is None  # nothing to adopt yet
    for spec in (evo, grad):
        default.run_dir(spec).mkdir(parents=True)
        (default.run_dir(spec) / "model_at_100.so").write_bytes(b"library")
    assert ablation.adopt(evo) is None  # not finished
    for spec in (evo, grad):
        default.result(spec).write_text(json.dumps({"run_id": spec.run_id, "commit": "abc1234"}))
    ablation.run_dir(evo).mkdir(parents=True)
    (ablation.run_dir(evo) / "pid").write_text("1")  # a half-finished run of the ablation's
    assert ablation.adopt(evo) == default.run_dir(evo)
    assert sorted(p.name for p in ablation.run_dir(evo).iterdir()) == ["model_at_100.so",
                                                                       "result.json"]  # fmt: skip
    assert ablation.results("bert_block") == [{"run_id": "evolutionary-r1", "commit": "abc1234"}]
    assert ablation.adopt(evo) is None  # finished now: kept as it is
    assert ablation.adopt(grad) is None and not ablation.finished(grad)
    assert Layout(tmp_path, 480.0, "steps=32", "adaptive").adopt(evo) is None
    assert default.adopt(evo) is None  # the default configuration tunes its own
    # Another warm-up changes both searchers: its layout lives apart and adopts only from
    # the default configuration of the same warm-up.
    stake = Layout(tmp_path, 480.0, warmup="stake")
    assert stake.root == tmp_path / "480s-warmup-stake" and stake.adopt(evo) is None
    assert stake.child_args()[-2:] == ["--warmup", "stake"]
    assert Layout(tmp_path, 480.0, "steps=32", warmup="stake").adopt(evo) is None


def test_leave_out_weights_are_cached_per_choice_of_machines(tmp_path):
    """params.yaml's ``pretrain.machines`` decides which records are trained on, so weights
    trained on another choice are never taken from the cache; the default's key is the one
    it had before the choice existed, so caches made then are still found."""
    import hashlib
    import json

    import numpy as np
    import torch
    from searchbench.layout import Layout
    from searchbench.prepare import cached_weights, file_sha1

    from gradtune.costmodel.train import Group

    torch.manual_seed(0)
    groups = [
        Group(f"k{w}", "fam", [torch.randn(2, 164) for _ in range(4)], np.arange(1.0, 5.0))
        for w in range(3)
    ]
    features = tmp_path / "features.pt"
    features.write_bytes(b"records")
    layout = Layout(tmp_path, 480.0)
    layout.costmodels.mkdir(parents=True)
    params = {"loss": "rank", "epochs": 1, "lr": 7e-4, "seed": 0, "machines": "target"}
    default, info = cached_weights(layout, groups, {"k1"}, params, features)
    assert info["workloads"] == 2 and default.is_file()
    before = {"removed": ["k1"], "features": file_sha1(features), **params}
    del before["machines"]
    key = hashlib.sha1(json.dumps(before, sort_keys=True).encode()).hexdigest()[:16]
    assert default.name == f"{key}.pt"
    mixed, _ = cached_weights(layout, groups, {"k1"}, {**params, "machines": "all"}, features)
    assert mixed != default and mixed.is_file()
    assert cached_weights(layout, groups, {"k1"}, params, features)[0] == default


def test_a_preparation_pretrained_with_other_settings_is_stale(monkeypatch):
    from searchbench import driver

    params = {"loss": "rank", "epochs": 40, "lr": 7e-4, "seed": 0, "machines": "target"}
    monkeypatch.setattr(driver, "pretrain_params", lambda: params)
    recorded = {"workloads": 72, "loss": "rank", "epochs": 40, "lr": 7e-4, "seed": 0}
    assert not driver.stale_pretraining(recorded)
    assert driver.stale_pretraining(recorded | {"epochs": 160})
    assert driver.stale_pretraining(recorded | {"loss": "mse"})
    assert not driver.stale_pretraining({"workloads": 72}), "unrecorded settings are not stale"


def test_runs_tuned_for_another_cpu_are_not_restored(tmp_path):
    import json

    from searchbench import api
    from searchbench.archive import restore
    from searchbench.layout import Layout

    config, _ = api.host_target()
    other = dict(config, mcpu="not-this-cpu")
    run = tmp_path / "archive" / "480s" / "runs" / "m" / "gradient-r0"
    run.mkdir(parents=True)
    (run / "result.json").write_text(json.dumps({"model": "m", "target": other}))
    layout = Layout(tmp_path / "work", 480.0)
    with pytest.raises(SystemExit, match="not-this-cpu.*not restored"):
        restore(layout, tmp_path / "archive")
    assert not (tmp_path / "work").exists(), "nothing is copied before the check"
