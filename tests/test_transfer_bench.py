"""bench/transfer_tuning.py: bad input refused before anything starts; its plan and metrics."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import assert_bench_refuses

pytestmark = pytest.mark.usefixtures("bench_on_path")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--models", "dcgan_like", "no_such_model"], "unknown model no_such_model"),
        (["--models", "dcgan_like"], "at least two"),
        (["--budget", "0"], "--budget must be positive"),
        (["--gradient-config", "no_such_field=1"], "GradientConfig has no field no_such_field"),
        (["--warmup", "random"], "unknown --warmup 'random'; choose one of model"),
        (["--warm-from", "best"], "unknown --warm-from 'best'; choose auto or all"),
        (["--warm-config", "no_such_field=1"], "--warm-config: GradientConfig has no field"),
    ],
)
def test_bad_input_is_one_line_before_anything_starts(tmp_path, args, says):
    assert_bench_refuses("transfer_tuning.py", tmp_path, args, says)


def test_plan_tunes_every_library_before_any_transfer_and_alternates_repeats():
    from transferbench.layout import FULL, TRANSFER, UNTUNED, WARM, plan

    models = ["a", "b", "c"]
    runs = plan(models, repeats=3)
    kinds = [(r.model, r.searcher, r.repeat) for r in runs]
    assert len(set(kinds)) == len(kinds) == 3 * (2 + 2) + 3 * 2 * 2
    first_transfer = min(i for i, r in enumerate(runs) if r.searcher in (TRANSFER, WARM))
    assert {r.model for r in runs[:first_transfer] if r.searcher == FULL} == set(models)
    assert {r.model for r in runs[:first_transfer] if r.searcher == UNTUNED} == set(models)
    later = [r for r in runs if r.repeat > 0]
    firsts = [later[i].searcher for i in range(0, len(later), 2)]
    assert set(firsts) == {FULL, WARM}, "neither kind always goes first"
    assert all(r.repeat == 0 for r in runs if r.searcher in (UNTUNED, TRANSFER))


def _rounds(*points: tuple[float, float]) -> list[dict]:
    return [{"wall_s": t, "estimated_us": us, "trials": i} for i, (t, us) in enumerate(points)]


def test_warm_ratio_is_time_to_cold_final_latency_and_bounds_a_warm_start_that_never_got_there():
    from transferbench.analysis import warm_ratio

    cold = {"rounds": _rounds((10, 900), (40, 600), (90, 500), (120, 500)),
            "final_estimated_us": 500.0}  # fmt: skip
    warm = {"rounds": _rounds((15, 520), (30, 480))}
    entry = warm_ratio(cold, warm, budget=120)
    assert entry["t_cold_s"] == 90 and entry["t_warm_s"] == 30
    assert entry["ratio"] == pytest.approx(3.0) and not entry["bound"]
    slow = {"rounds": _rounds((15, 700), (119, 510), (130, 400))}  # 130 s is past the budget
    entry = warm_ratio(cold, slow, budget=120)
    assert entry["bound"] and entry["ratio"] == pytest.approx(90 / 120)


def test_warm_lead_is_cold_over_warm_estimate_at_shares_of_the_budget():
    from transferbench.analysis import warm_ratio

    cold = {"rounds": _rounds((40, 900), (70, 600), (90, 500)), "final_estimated_us": 500.0}
    warm = {"rounds": _rounds((35, 300), (80, 450), (100, 280))}
    entry = warm_ratio(cold, warm, budget=120)
    # At 30 s neither had an estimate; at 60 s 900 against 300; at 90 s 500 against the best
    # so far, 300 (a later batch's worse estimate does not count).
    lead = {"0.25": None, "0.5": pytest.approx(3.0), "0.75": pytest.approx(500 / 300)}
    assert entry["lead"] == lead


def test_share_of_full_speedup_is_the_share_of_the_gain_and_none_within_noise(tmp_path):
    import json

    from searchbench.layout import RunSpec, write_json
    from transferbench.analysis import model_metrics
    from transferbench.layout import TransferLayout

    layout = TransferLayout(tmp_path, 60.0)

    def finish(kind: str, wall: float) -> None:
        spec = RunSpec("m", kind, 0)
        result = {"run_id": spec.run_id, "searcher": kind, "repeat": 0, "wall_s": wall}
        write_json(layout.result(spec), result | {"rounds": [], "transfer": None})

    for kind, wall in (("untuned", 0.0), ("full", 66.0), ("transfer", 11.0)):
        finish(kind, wall)
    timing = {"untuned-r0@100": 3.0, "full-r0@100": 1.0, "transfer-r0@100": 1.5}
    write_json(layout.timing("m"), {"ms": timing})
    metrics = model_metrics(layout, "m")
    assert metrics["warmup_skipped"] == {}, "no warm run"
    # Untuned → full gains 2.0 (3×); the transfer gains 1.0 (2×): half of the gain.
    assert metrics["fraction_of_full_speedup"] == pytest.approx(0.5)
    assert metrics["time_ratio"] == pytest.approx(6.0)
    timing["full-r0@100"] = 2.99  # full tuning gained nothing measurable
    layout.timing("m").write_text(json.dumps({"ms": timing}))
    assert model_metrics(layout, "m")["fraction_of_full_speedup"] is None
    # In passes, the share is taken within each: a pass twice as slow throughout still says
    # half, and one pass where the transfer's library ran slow says 0; the median is 0.5
    # (the medians over passes, 3 / 1 / 3 ms, would have said 0).
    passes = [
        {"untuned-r0@100": 3.0, "full-r0@100": 1.0, "transfer-r0@100": 1.5},
        {"untuned-r0@100": 6.0, "full-r0@100": 2.0, "transfer-r0@100": 3.0},
        {"untuned-r0@100": 3.0, "full-r0@100": 1.0, "transfer-r0@100": 3.0},
    ]
    medians = {"untuned-r0@100": 3.0, "full-r0@100": 1.0, "transfer-r0@100": 3.0}
    layout.timing("m").write_text(json.dumps({"ms": medians, "passes": passes}))
    assert model_metrics(layout, "m")["fraction_of_full_speedup"] == pytest.approx(0.5)


def test_the_report_counts_the_tasks_whose_warm_up_a_warm_start_skipped(tmp_path):
    from searchbench.layout import RunSpec, write_json
    from transferbench.analysis import gather
    from transferbench.layout import TransferLayout
    from transferbench.report import text

    layout = TransferLayout(tmp_path, 120.0, warmup="skip")
    cold = {"rounds": _rounds((10, 900), (90, 500)), "final_estimated_us": 500.0, "wall_s": 120}
    warm = {"rounds": _rounds((15, 520), (30, 480)), "wall_s": 120, "tasks": 9}
    specs = [RunSpec("m", "full", 0), RunSpec("m", "warm", 0), RunSpec("m", "warm", 1)]
    results = (cold, warm | {"warmup_skipped": ["a", "b"]}, warm)
    for spec, result in zip(specs, results, strict=True):
        base = {"run_id": spec.run_id, "searcher": spec.searcher, "repeat": spec.repeat}
        write_json(layout.result(spec), base | {"transfer": None, "budget_s": 120.0} | result)
    data = gather(layout, specs, ["m"])
    # Repeat 1 predates the count: left out, not read as none skipped.
    assert data["models"]["m"]["warmup_skipped"] == {0: [2, 9]}
    assert "or a transferred one), of the model's tasks: m r0 2/9." in text(data)


def test_warm_starts_are_also_weighed_against_the_search_benchmarks_evolutionary_runs(tmp_path):
    """Issue 14's peer: where bench/search_efficiency.py left evolutionary runs of the model in
    the same work dir and budget, for the same target, each warm start is timed to the
    evolutionary run's final estimate of its repeat; another target's or batch's is no peer."""
    from searchbench.layout import Layout, RunSpec, write_json
    from transferbench.analysis import gather
    from transferbench.layout import TransferLayout
    from transferbench.report import text

    here, there = {"kind": "llvm", "mcpu": "here"}, {"kind": "llvm", "mcpu": "there"}
    search = Layout(tmp_path, 120.0)
    evolutionary = {  # reaches 400 µs, its final by the budget, at 100 s
        0: {"rounds": _rounds((50, 900), (100, 400), (130, 300)), "target": here},
        1: {"rounds": _rounds((60, 500)), "target": there},
        2: {"rounds": _rounds((60, 500)), "target": here, "per_round_is_default": False},
    }
    for repeat, result in evolutionary.items():
        spec = RunSpec("m", "evolutionary", repeat)
        write_json(search.result(spec), result | {"searcher": "evolutionary", "repeat": repeat})
    layout = TransferLayout(tmp_path, 120.0)
    specs = [RunSpec("m", "warm", r) for r in range(3)]
    for spec in specs:
        warm = {"rounds": _rounds((20, 450), (25, 390)), "wall_s": 120, "target": here}
        base = {"run_id": spec.run_id, "searcher": spec.searcher, "repeat": spec.repeat}
        write_json(layout.result(spec), base | {"transfer": None, "budget_s": 120.0} | warm)
    m = gather(layout, specs, ["m"])["models"]["m"]
    assert list(m["warm_vs_evolutionary_per_repeat"]) == [0]
    assert m["warm_vs_evolutionary_t_ratio"] == pytest.approx(100 / 25)
    assert not m["warm_vs_evolutionary_bound"]
    assert "m 4.00× over 1 repeats" in text(gather(layout, specs, ["m"]))


def test_a_full_run_adopts_the_search_efficiency_run_it_would_repeat(tmp_path):
    """The search-efficiency benchmark's default gradient run (same model, budget, seed, cost
    model, call) is a ``full`` run already made: adopted with its database, its build at the
    budget and a partition table; a failed one, one of another batch size, or one restored from
    an archive (no whole database) is not."""
    from searchbench.layout import Layout, RunSpec, write_json
    from transferbench.layout import FULL, TransferLayout
    from transferbench.step import adopt, search_efficiency_run

    peer, layout = Layout(tmp_path, 480), TransferLayout(tmp_path, 480)
    full = RunSpec("mbconv_se", FULL, 1)
    assert search_efficiency_run(full, layout) is None
    twin = RunSpec("mbconv_se", "gradient", 1)
    source = peer.run_dir(twin)
    for folder in ("db_at_100", "db"):
        (source / folder).mkdir(parents=True)
        (source / folder / "database_tuning_record.json").write_text("{}\n")
    (source / "model_at_100.so").write_bytes(b"lib")
    result = {"model": "mbconv_se", "searcher": "gradient", "repeat": 1, "run_id": "gradient-r1",
              "per_round_is_default": True, "wall_s": 481.0, "commit": "abc1234",
              "rounds": [{"wall_s": 100.0, "estimated_us": 900.0, "trials": 25}],
              "builds": {"25": {"library": "model_at_25.so"},
                         "100": {"library": "model_at_100.so", "records": 25}}}  # fmt: skip
    write_json(peer.result(twin), result | {"error": "boom"})
    assert search_efficiency_run(full, layout) is None, "a failed run is not adopted"
    write_json(peer.result(twin), result | {"per_round_is_default": False})
    assert search_efficiency_run(full, layout) is None, "another batch size is another run"
    write_json(peer.result(twin), result)
    assert search_efficiency_run(full, layout) == source
    shutil.rmtree(source / "db")  # as restored from an archive: its builds' best records only
    assert search_efficiency_run(full, layout) is None
    (source / "db").mkdir()
    (source / "db" / "database_tuning_record.json").write_text("{}\n")
    # A run of another gradient configuration is another run: one from before
    # structural_variants existed (it searched with 0) is adopted only by a layout that names 0.
    older = {k: v for k, v in layout.gradient_effective().items() if k != "structural_variants"}
    write_json(peer.result(twin), result | {"gradient_config_effective": older})
    assert search_efficiency_run(full, layout) is None
    pinned = TransferLayout(tmp_path, 480, "structural_variants=0")
    assert search_efficiency_run(full, pinned) == source
    write_json(peer.result(twin), result)

    adopted = adopt(full, layout, source, tasks=[])
    run_dir = layout.run_dir(full)
    assert (run_dir / "db" / "database_tuning_record.json").is_file()
    assert (run_dir / "db_at_100" / "database_tuning_record.json").is_file()
    assert (run_dir / "model_at_100.so").read_bytes() == b"lib"
    assert adopted["searcher"] == FULL and adopted["run_id"] == "full-r1"
    assert adopted["builds"] == {"100": result["builds"]["100"]}
    assert adopted["final_estimated_us"] == 900.0 and adopted["commit"] == "abc1234"
    assert adopted["adopted_from"] == str(source)


def test_a_warm_up_ablation_makes_only_warm_runs_against_the_default_layouts_cold_ones(tmp_path):
    """``--warmup skip`` (not tune's default) lives apart and copies in the default warm-up's
    finished untuned, full and transfer runs (every warm-up weighed against the same cold
    runs); its warm runs are its own, and its children get the flag. The default layout
    refuses to add warm runs of its warm-up to those of another."""
    from searchbench.layout import RunSpec, write_json
    from transferbench.layout import FULL, TRANSFER, WARM, TransferLayout

    default, skip = TransferLayout(tmp_path, 480), TransferLayout(tmp_path, 480, warmup="skip")
    assert skip.root == tmp_path / "480s-transfer-warmup-skip" and skip.root != default.root
    assert skip.child_args()[-2:] == ["--warmup", "skip"]
    assert "--warmup" not in default.child_args()
    full, transfer, warm = (RunSpec("m", kind, 0) for kind in (FULL, TRANSFER, WARM))
    assert skip.adopt(full) is None, "nothing finished to copy: it runs its own"
    for spec in (full, warm):
        write_json(default.result(spec), {"run_id": spec.run_id, "searcher": spec.searcher})
    (default.run_dir(full) / "db").mkdir()
    assert skip.adopt(full) == default.run_dir(full)
    assert skip.finished(full) and (skip.run_dir(full) / "db").is_dir()
    assert skip.adopt(full) is None, "copied once"
    assert skip.adopt(warm) is None and not skip.finished(warm), "warm runs are its own"
    assert skip.adopt(transfer) is None
    assert default.adopt(full) is None, "the default layout copies nothing"
    # A warm run from before runs recorded their warm-up ran skip: no stake run joins it.
    specs = [warm, RunSpec("m", WARM, 1)]
    assert "warm runs of warm-up skip, not stake" in default.mixed_config(specs, (FULL, WARM))
    stake = {"run_id": warm.run_id, "searcher": WARM, "warmup": "stake"}
    write_json(default.result(warm), stake | {"transfer": {"source": "/runs/a/db"}})
    assert "warm runs from source auto, not all" in default.mixed_config(specs, (FULL, WARM))
    write_json(default.result(warm), stake | {"transfer": {"source": "all"}})
    assert default.mixed_config(specs, (FULL, WARM)) is None
    eq1 = TransferLayout(tmp_path, 480, warm_from="auto")
    assert eq1.root == tmp_path / "480s-transfer-from-auto"
    assert eq1.child_args()[-2:] == ["--warm-from", "auto"]
    assert eq1.adopt(full) == default.run_dir(full) and not eq1.finished(warm)


def test_a_warm_search_ablation_changes_only_the_warm_runs_configuration(tmp_path):
    """``--warm-config`` gives the warm runs' search its fields over ``--gradient-config``,
    leaves the full runs' as they are (copied in from the default layout), lives apart, and
    refuses to add warm runs to ones made with another warm configuration."""
    from searchbench.layout import RunSpec, write_json
    from transferbench.layout import FULL, WARM, TransferLayout

    from gradtune.search.gradient_search import GradientConfig

    default = TransferLayout(tmp_path, 480, "steps=32")
    share = TransferLayout(tmp_path, 480, "steps=32", warm_config="warmup_by_share=True")
    assert share.root == tmp_path / "480s-transfer-steps=32-warm-warmup_by_share=True"
    assert share.child_args()[-2:] == ["--warm-config", "warmup_by_share=True"]
    assert share.kwargs_of(WARM) == {"steps": 32, "warmup_by_share": True}
    assert share.kwargs_of(FULL) == default.kwargs_of(WARM) == {"steps": 32}
    full, warm = RunSpec("m", FULL, 0), RunSpec("m", WARM, 0)
    cold = {"run_id": full.run_id, "searcher": FULL}
    write_json(default.result(full), cold | {"gradient_config_effective": share.effective_of(FULL)})
    assert share.adopt(full) == default.run_dir(full), "the same cold runs"
    specs = [full, warm, RunSpec("m", WARM, 1)]
    assert share.mixed_config(specs, (FULL, WARM)) is None
    plain = GradientConfig(steps=32).as_json()
    write_json(share.result(warm), {"run_id": warm.run_id, "searcher": WARM, "warmup": "stake"}
               | {"gradient_config_effective": plain})  # fmt: skip
    assert "warmup_by_share" in share.mixed_config(specs, (FULL, WARM))
    # Its full runs are the warm runs' library, whose SPEC a comma would split.
    two = TransferLayout(tmp_path, 480, warm_config="warm_warmup=4,warm_explore=False")
    assert two.root == tmp_path / "480s-transfer-warm-warm_warmup=4+warm_explore=False"
    assert two.child_args()[-1] == "warm_warmup=4,warm_explore=False"


def test_the_median_ratio_is_a_bound_only_where_a_never_reached_repeat_can_move_it():
    from transferbench.analysis import median_ratio

    def repeats(*entries):
        return {i: {"ratio": r, "bound": b} for i, (r, b) in enumerate(entries)}

    # Below the other two, the never-reached repeat cannot move the middle one.
    assert median_ratio(repeats((0.99, True), (1.45, False), (8.07, False))) == (1.45, False)
    assert median_ratio(repeats((0.99, True), (1.45, False))) == (pytest.approx(1.22), True)
    assert median_ratio(repeats((0.99, True))) == (0.99, True)
    assert median_ratio(repeats((None, False))) == (None, False)
