"""gradtune's online cost model is a MetaSchedule cost model: MetaSchedule's own evolutionary
search tunes with it (its ``update`` fine-tunes on the measured batches, its ``predict`` scores
the population), and it saves and loads with the session's measurements."""

import numpy as np
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
