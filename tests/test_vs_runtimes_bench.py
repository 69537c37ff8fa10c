"""bench/vs_runtimes.py --render: gathers what finished and tunes nothing."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import BENCH, ROOT

# Every peer ran, at 0.2 ms: the rows of a result the markdown is rendered from.
PEERS = {p: {"ms": 0.2, "error": None} for p in ("ONNX Runtime", "torch.compile", "PyTorch eager")}


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


def test_retime_tunes_nothing_and_says_which_models_had_no_tune(tmp_path):
    done = subprocess.run(
        [sys.executable, str(BENCH / "vs_runtimes.py"), "--retime", "--work", str(tmp_path / "w"),
         "--out", str(tmp_path / "out"), "--models", "mbconv_se"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "w" / "runs").exists()
    assert f"mbconv_se: not tuned as asked in {tmp_path / 'w'}: nothing to time" in done.stdout


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
    TIMING_ATTEMPTS, or before the probe, is not finished: the next run times it again. It
    was tuned all the same, which is what --retime asks of a result."""
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
        assert vs_runtimes.tuned(tmp_path, bench, 480.0, 5000) == {**record, **timing}
    assert vs_runtimes.tuned(tmp_path, bench, 1200.0, 5000) is None  # another budget


def test_a_model_tuned_with_other_tune_args_is_not_finished(tmp_path, bench_on_path):
    """A compilation option weighed with --tune-args lives in a work directory of its own, but
    a result there tuned with other options (or none) must not pass for one tuned with these."""
    import vs_runtimes
    from searchbench.layout import today_defaults, write_json
    from searchbench.models import MODELS

    bench = MODELS["squeeze_fire"]
    record = {"budget_s": 480.0, "trials_budget": 5000, "source_sha1": bench.source_sha1(),
              "gradient_config": today_defaults(), "timing": {"state": "near"}}  # fmt: skip
    path = vs_runtimes.result_path(tmp_path, bench.name)
    nchwc = ["--conv-layout", "NCHWc"]
    for recorded, asked, finished in [
        (None, [], True),  # recorded before results named their tune args
        (nchwc, nchwc, True),
        (nchwc, [], False),
        (None, nchwc, False),
        (["--conv-layout", "NHWC"], nchwc, False),
    ]:
        write_json(path, {**record, **({"tune_args": recorded} if recorded else {})})
        done = vs_runtimes.finished(tmp_path, bench, 480.0, 5000, asked)
        assert done is finished, (recorded, asked)


def test_bad_tune_args_or_alongside_fail_in_one_line_before_any_tune(tmp_path):
    for extra, says in [
        (["--tune-args", "--conv-layout 'NCHWc"], "--tune-args"),
        (["--alongside", str(tmp_path / "missing")], "is not a directory"),
        (["--budget-for", "resnet=900"], "no benchmark model 'resnet'"),
        (["--budget-for", "unet_small=15min"], "'15min' is not a number of seconds"),
        (["--budget-for", "unet_small=0"], "must be above 0 s"),
    ]:
        done = subprocess.run(
            [sys.executable, str(BENCH / "vs_runtimes.py"), "--work", str(tmp_path / "w"),
             "--models", "squeeze_fire", *extra],
            capture_output=True, text=True, timeout=120, cwd=ROOT,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert says in done.stderr.strip().splitlines()[-1]
        assert not (tmp_path / "w").exists()


def test_the_markdown_names_the_tune_args_and_the_library_timed_alongside(bench_on_path):
    import vs_runtimes

    row = {"zoo_model": "resnet18_like", "budget_s": 480.0, "tuned_at": "abc1234", "trials": 600,
           "tuned_ms": 0.18, "peers": PEERS, "vs_ort": 0.9, "vs_torch_compile": 0.9,
           "vs_eager": 0.9, "timing": {"state": "near"}, "loadavg_before": [1.0, 1.0, 1.0],
           "alongside": "/w/default", "alongside_ms": 0.2, "vs_alongside": 0.9,
           "groups": []}  # fmt: skip
    machine = {"cpu": "AMD EPYC", "logical_cores": 2, "target": {"kind": "llvm"}}
    data = {"commit": "abc1234", "machine": machine, "budget_s": 480.0, "trials_budget": 5000,
            "tune_args": ["--conv-layout", "NCHWc"], "partial": False, "failed": {},
            "models": {"resnet18_like": row}, "geomean_vs_ort": 0.9,
            "geomean_vs_torch_compile": 0.9, "geomean_vs_ort_alongside": 1.0}  # fmt: skip
    text = vs_runtimes.markdown(data)
    assert "`gradtune tune --time-budget 480 --trials 5000 --conv-layout NCHWc`" in text
    assert "- resnet18_like: 0.180 against 0.200 ms (/w/default): 0.90" in text
    assert "in these ones' place, the geomean vs ONNX Runtime is 1.00." in text
    # The alongside library's ratio comes from the same rounds' ONNX Runtime (0.2 ms).
    assert vs_runtimes.alongside_vs_ort(row) == 1.0
    assert vs_runtimes.alongside_vs_ort({"vs_ort": 0.9, "alongside_ms": None}) == 0.9


def test_a_model_s_own_budget_decides_whether_it_is_finished_and_is_stated(tmp_path, bench_on_path):
    """``--budget-for`` gives one model its own budget: its result counts as finished only at
    that budget, the others' at ``--budget``, and the markdown states each row's."""
    import vs_runtimes
    from searchbench.layout import today_defaults, write_json
    from searchbench.models import MODELS

    for name, budget in [("unet_small", 1200.0), ("bert_block", 480.0)]:
        write_json(vs_runtimes.result_path(tmp_path, name), {
            "budget_s": budget, "trials_budget": 5000, "source_sha1": MODELS[name].source_sha1(),
            "gradient_config": today_defaults(), "timing": {"state": "near"},
            "zoo_model": None, "tuned_at": "abc1234", "trials": 600, "tuned_ms": 0.18,
            "peers": PEERS, "vs_ort": 0.9, "vs_torch_compile": 0.9, "vs_eager": 0.9,
            "loadavg_before": [1.0, 1.0, 1.0], "groups": [],
            "target": {"kind": "llvm", "num-cores": 2},
        })  # fmt: skip
    base = ["--work", str(tmp_path), "--models", "unet_small", "bert_block"]
    args = vs_runtimes.parse_args(base)
    args.work = tmp_path
    assert list(vs_runtimes.gather(args, args.models, {})["models"]) == ["bert_block"]
    args = vs_runtimes.parse_args([*base, "--budget-for", "unet_small=1200"])
    args.work = tmp_path
    data = vs_runtimes.gather(args, args.models, {})
    assert list(data["models"]) == ["unet_small", "bert_block"] and not data["partial"]
    text = vs_runtimes.markdown(data)
    assert "; `--time-budget` as its row's budget column states, `--budget-for`)" in text
    assert "| unet_small | held out | 1200 | abc1234 |" in text
    assert "| bert_block | held out | 480 | abc1234 |" in text
    assert vs_runtimes.summary_line(data)["models"]["unet_small"]["budget_s"] == 1200.0


def test_a_result_timed_wholly_apart_is_labelled_so_against_all_the_results(bench_on_path):
    """A timing judged by its own fastest probe (before the machine's was kept) calls itself
    near while its cores sat apart throughout: against the fastest probe of every result it is
    apart, and the geomean is also given within each state."""
    import vs_runtimes

    def result(vs_ort: float, link_ns: list[int], **timing) -> dict:
        return {"vs_ort": vs_ort, "timing": {"state": "near", "link_ns": link_ns, **timing}}

    results = {
        "a": result(0.8, [472, 600]),
        "b": result(1.1, [1400, 1700]),  # near only by its own probes
        "c": result(0.9, [1350, 1500], near_ns=460, state="apart"),  # judged by the machine's
        "d": {"vs_ort": 1.0, "timing": None},  # timed before the probe
    }
    vs_runtimes.label_against_all(results)
    states = [vs_runtimes.state_of(r) for r in results.values()]
    assert states == ["near", "apart", "apart", "unprobed"]
    assert results["b"]["timing"]["near_ns"] == 460
    both = {"near": {"geomean": 0.85, "models": 2}, "apart": {"geomean": 1.05, "models": 2}}
    assert vs_runtimes.state_geomeans(both) == (
        " Within one cores state, vs ONNX Runtime: near 0.85 (2 models), apart 1.05 (2 models)."
    )
    assert vs_runtimes.state_geomeans({"near": both["near"]}) == ""
    assert vs_runtimes.cores_cell(results["b"]) == "apart (1400 ns)"
