import numpy as np
import pytest

from gradtune import compilation
from gradtune.errors import GradtuneError
from gradtune.partition import prepare


def test_untuned_build_matches_reference_and_exports(tiny_model, llvm_target, tmp_path):
    fused = prepare(tiny_model.mod, tiny_model.params, llvm_target)
    executable = compilation.build(fused, llvm_target)
    runner = compilation.Runner(executable, llvm_target, tiny_model.inputs)
    err = compilation.verify(runner.outputs(), tiny_model.reference_outputs, "untuned")
    assert err < 1e-4
    lib = compilation.export(executable, tmp_path / "m.so")
    vm, dev = compilation.load_exported(lib)
    import tvm

    out = compilation.flatten_outputs(vm["main"](tvm.runtime.tensor(tiny_model.inputs[0], dev)))
    np.testing.assert_allclose(out[0], tiny_model.reference_outputs[0], rtol=1e-4, atol=1e-5)


def test_verify_rejects_wrong_outputs():
    ref = [np.ones((2, 3), dtype="float32")]
    with pytest.raises(GradtuneError, match="differ from the reference"):
        compilation.verify([ref[0] + 0.5], ref, "tuned TVM")
    with pytest.raises(GradtuneError, match="returns 2 outputs"):
        compilation.verify([ref[0], ref[0]], ref, "tuned TVM")


def test_time_interleaved_reports_each_contender():
    import time

    result = compilation.time_interleaved(
        {"fast": lambda: None, "slow": lambda: time.sleep(0.002)}, repeats=3, min_seconds=0.01
    )
    assert set(result) == {"fast", "slow"}
    assert result["slow"] >= 2.0 > result["fast"]


def test_prepacked_weights_are_rewritten_by_tuned_kernels_and_folded_at_build(
    tiny_model, llvm_target, tmp_path
):
    """``weight_prepack``: the weights are layout-free, MetaSchedule's ``RewriteLayout`` stores
    them in the tuned loop nest's order, and the build folds that into the constants, with
    the same outputs."""
    from tvm.s_tir import meta_schedule as ms

    from gradtune.measure.rpc_fleet import LocalFleet
    from gradtune.partition import extract
    from gradtune.search.stoppable import Stoppable
    from gradtune.tune import run_database, tune

    fused = prepare(tiny_model.mod, tiny_model.params, llvm_target, weight_prepack=True)
    assert compilation.has_layout_free_weights(fused)
    assert not compilation.has_layout_free_weights(
        prepare(tiny_model.mod, tiny_model.params, llvm_target)
    )
    tasks = extract(fused, llvm_target)
    search = Stoppable(ms.search_strategy.EvolutionarySearch(
        population_size=16, init_min_unmeasured=8, genetic_num_iters=1
    ))  # fmt: skip
    with LocalFleet() as tracker:
        tune(tasks, llvm_target, tmp_path, tracker, max_trials=4 * len(tasks), search=search,
             trials_per_round=4)  # fmt: skip
    database = run_database(tmp_path)
    rewritten = [
        r for r in database.get_all_tuning_records()
        if "layout_rewrite_preproc" in r.as_measure_candidate().sch.mod.script()
    ]  # fmt: skip
    assert rewritten, "no tuned kernel rewrote a weight's layout"
    executable = compilation.build(fused, llvm_target, database)
    runner = compilation.Runner(executable, llvm_target, tiny_model.inputs)
    assert compilation.verify(runner.outputs(), tiny_model.reference_outputs, "prepacked") < 1e-4


def test_weight_prepack_is_refused_for_a_gpu_target(tiny_model):
    from gradtune.target import make_target, parse_target

    cuda = make_target(parse_target("cuda"))
    with pytest.raises(GradtuneError, match="CPU targets"):
        prepare(tiny_model.mod, tiny_model.params, cuda, weight_prepack=True)
