"""gradtune's online cost model is a MetaSchedule cost model: MetaSchedule's own evolutionary
search tunes with it (its ``update`` fine-tunes on the measured batches, its ``predict`` scores
the population), and it saves and loads with the session's measurements."""

import numpy as np
import pytest
import torch

from gradtune.costmodel.model import FelixMLP
from gradtune.costmodel.online import OnlineCostModel
from gradtune.partition import partition


def test_evolutionary_search_tunes_with_the_online_cost_model(tiny_model, llvm_target, tmp_path):
    from tvm.s_tir import meta_schedule as ms

    from gradtune.costmodel.featurize import replay
    from gradtune.measure.builder import make_builder
    from gradtune.tvm_compat import register_tensor_intrinsics

    register_tensor_intrinsics("llvm")
    _, tasks = partition(tiny_model.mod, tiny_model.params, llvm_target)
    task = max(tasks, key=lambda t: t.flops)
    cost_model = OnlineCostModel.default("llvm", epochs=2)
    pretrained = [p.detach().clone() for p in cost_model.model.parameters()]
    search = ms.search_strategy.EvolutionarySearch(
        population_size=8, init_min_unmeasured=8, genetic_num_iters=1
    )
    context = ms.TuneContext(
        mod=task.mod, target=llvm_target, space_generator="post-order-apply",
        search_strategy=search, task_name=task.name, num_threads=1,
    )  # fmt: skip
    database = ms.database.MemoryDatabase()
    # A local runner rather than an RPC fleet: what is under test is the cost model's seam.
    ms.tune_tasks(
        tasks=[context], task_weights=[1.0], work_dir=str(tmp_path), max_trials_global=8,
        num_trials_per_iter=4, builder=make_builder(max_workers=1),
        runner=ms.runner.LocalRunner(), database=database, cost_model=cost_model,
        task_scheduler="round-robin",
    )  # fmt: skip
    records = database.get_all_tuning_records()
    assert len(records) == 8
    programs, latencies = cost_model.data[task.name]
    assert len(programs) == len(latencies) >= 4, "update featurized the measured candidates"
    assert len(cost_model.losses) == 2, "one fine-tune per measured batch"
    now = list(cost_model.model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(pretrained, now, strict=True))

    # Scores for candidates MetaSchedule hands over: positive, finite, one per candidate.
    args_info = ms.arg_info.ArgInfo.from_prim_func(task.mod["main"])
    postprocs = list(context.space_generator.postprocs)
    candidates = [
        ms.MeasureCandidate(replay(task.mod, r.trace, postprocs), args_info) for r in records
    ]
    scores = cost_model.predict(context, candidates)
    assert scores.shape == (8,) and scores.dtype == np.float64
    assert np.isfinite(scores).all() and (scores > 0).all() and np.ptp(scores) > 0

    # Saved and loaded: the same scores, the same measurements, hyper-parameters kept.
    path = tmp_path / "online.pt"
    cost_model.save(str(path))
    fresh = OnlineCostModel(FelixMLP(), epochs=3)
    fresh.load(str(path))
    np.testing.assert_allclose(fresh.predict(context, candidates), scores, rtol=1e-6)
    assert fresh.source == cost_model.source and fresh.epochs == 3
    assert fresh.data[task.name][1] == latencies


def test_tune_scores_evolutionary_search_with_the_ensemble_in_the_schedulers_slot(
    tiny_model, llvm_target, tmp_path
):
    """``tune(cost_model=...)``: MetaSchedule's evolutionary search scores with AdaTune's
    ensemble instead of its XGBoost (the ablation row), and every member learns from the
    measured batches."""
    from tvm.s_tir import meta_schedule as ms

    from gradtune.measure.rpc_fleet import LocalFleet
    from gradtune.search.stoppable import Stoppable
    from gradtune.tune import count_records, run_database, tune

    _, tasks = partition(tiny_model.mod, tiny_model.params, llvm_target)
    task = max(tasks, key=lambda t: t.flops)
    ensemble = OnlineCostModel.ensemble("llvm", epochs=1)
    before = [[p.detach().clone() for p in m.parameters()] for m in ensemble.members]
    # MetaSchedule's evolutionary search, with a population small enough for a test.
    search = Stoppable(ms.search_strategy.EvolutionarySearch(
        population_size=16, init_min_unmeasured=8, genetic_num_iters=1
    ))  # fmt: skip
    with LocalFleet() as tracker:
        tune([task], llvm_target, tmp_path, tracker, max_trials=8, search=search,
             trials_per_round=4, cost_model=ensemble)  # fmt: skip
    assert count_records(run_database(tmp_path)) >= 4
    programs, latencies = ensemble.data[task.name]
    assert len(programs) == len(latencies) >= 2, "update featurized the measured candidates"
    for old, member in zip(before, ensemble.members, strict=True):
        assert any(not torch.equal(a, b) for a, b in zip(old, member.parameters(), strict=True))


def test_the_schedulers_cost_model_is_never_the_gradient_searchs_own(
    tiny_model, llvm_target, tmp_path
):
    from gradtune.errors import GradtuneError
    from gradtune.search import make_strategy
    from gradtune.tune import tune

    _, tasks = partition(tiny_model.mod, tiny_model.params, llvm_target)
    strategy = make_strategy("gradient")
    with pytest.raises(GradtuneError, match="separate one"):
        tune(tasks, llvm_target, tmp_path, None, max_trials=4, search=strategy,
             cost_model=strategy.cost_model)  # fmt: skip
