"""The gradient search plugs into MetaSchedule's tuning loop like any strategy: it fills the
JSONDatabase, resumes without measuring a schedule twice, and fine-tunes its cost model."""

import math

import numpy as np
import pytest
import torch

from gradtune.costmodel.model import FelixMLP, pad
from gradtune.costmodel.train import Group, fit, group_metrics, summarize
from gradtune.partition import partition
from tests.conftest import search_on


def test_felix_mlp_size_and_padding_are_exact():
    model = FelixMLP()
    assert 200_000 < sum(p.numel() for p in model.parameters()) < 300_000
    a, b = torch.randn(3, 164), torch.randn(1, 164)
    features, mask = pad([a, b])
    assert features.shape == (2, 3, 164) and mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    # Padding stores contribute nothing: scoring b alone or padded gives the same score.
    together = model(features, mask)
    alone = model.score([b])
    assert torch.allclose(together[1], alone[0], atol=1e-6)


def test_ranking_metrics_and_rank_training_learn_an_order():
    rng = np.random.default_rng(0)
    groups = []
    for w in range(4):
        programs = [torch.randn(2, 164) for _ in range(24)]
        # Latency falls with the first feature of the first store: a learnable order.
        latencies = np.array([1.0 + np.exp(-float(p[0, 0])) for p in programs]) * (w + 1)
        groups.append(Group(f"w{w}", "fam", programs, latencies))
    perfect = group_metrics(-groups[0].latencies, groups[0].latencies)
    assert perfect["pairwise"] == 1.0 and perfect["top1"] == 1.0 and perfect["spearman"] > 0.99
    model = FelixMLP()
    fit(model, groups, loss="rank", epochs=30, seed=int(rng.integers(100)))
    with torch.no_grad():
        rows = [
            (g.family, group_metrics(model.score(g.programs).numpy(), g.latencies)) for g in groups
        ]
    overall = summarize(rows)["overall"]
    assert overall["pairwise"] > 0.85 and overall["workloads"] == 4


@pytest.mark.slow
def test_gradient_search_tunes_and_resumes_without_measuring_twice(
    tiny_model, llvm_target, tmp_path, fleet
):
    from gradtune.search import make_strategy
    from gradtune.search.gradient_search import GradientConfig
    from gradtune.tune import count_records, run_database, tune

    _, tasks = partition(tiny_model.mod, tiny_model.params, llvm_target)
    config = GradientConfig(seeds=4, steps=6)
    first = make_strategy("gradient", config=config)
    result = tune(tasks, llvm_target, tmp_path, fleet, max_trials=8, search=first,
                  trials_per_round=4)  # fmt: skip
    assert result.trials == 8 and count_records(run_database(tmp_path)) == 8
    assert result.rounds and not result.search_summary.fallback_tasks
    # What it searched with, whole (defaults move between commits), as JSON gives it back.
    assert result.search_config["seeds"] == 4 and result.search_config["steps"] == 6
    assert result.search_config["split_bounds"] == list(config.split_bounds)
    assert set(result.search_config) == set(GradientConfig._fields)
    # Every batch was the gradient search's (its account joined the loop's record); the
    # trials besides each task's default schedule, never more than the budget.
    assert all(r.search is not None and 0 < r.measured <= 4 for r in result.rounds)
    assert sum(r.measured for r in result.rounds) == 8 - len(tasks)
    assert first.cost_model.losses, "measurements fine-tune the model"
    second = make_strategy("gradient", config=config)
    tune(tasks, llvm_target, tmp_path, fleet, max_trials=12, search=second,
         trials_per_round=4)  # fmt: skip
    records = run_database(tmp_path).get_all_tuning_records()
    assert len(records) == 12
    import tvm_ffi

    keys = {(int(tvm_ffi.structural_hash(r.workload.mod)), str(r.trace)) for r in records}
    assert len(keys) == 12, "a schedule was measured twice"


@pytest.mark.slow
def test_adatune_search_tunes_with_the_bundled_ensemble_and_adaptive_measurement(
    tiny_model, llvm_target, tmp_path, fleet
):
    """The whole of AdaTune on the descent in a real tune: the bundled ensemble, log EI,
    the contextual explore share logged per round, candidates timed by the adaptive evaluator
    (its device time accounted), every record in TVM's database format."""
    from gradtune.costmodel.online import OnlineCostModel
    from gradtune.measure.runner import MeasureSettings
    from gradtune.search import make_strategy
    from gradtune.search.gradient_search import GradientConfig
    from gradtune.tune import count_records, run_database, tune

    _, tasks = partition(tiny_model.mod, tiny_model.params, llvm_target)
    cost_model = OnlineCostModel.ensemble("llvm", epochs=1)
    assert len(cost_model.members) == 4
    config = GradientConfig(seeds=4, steps=6, acquisition="ei", contextual_explore=True)
    strategy = make_strategy("gradient", cost_model=cost_model, config=config)
    result = tune(tasks, llvm_target, tmp_path, fleet, max_trials=8, search=strategy,
                  trials_per_round=4, measure=MeasureSettings(mode="adaptive"))  # fmt: skip
    assert result.trials == 8 and count_records(run_database(tmp_path)) == 8
    searched = [r.search for r in result.rounds if r.search is not None]
    assert searched and all(0.05 <= s.explore_share <= 0.5 for s in searched)
    assert all(math.isfinite(s.mean_sigma) and s.mean_sigma > 0 for s in searched)
    assert result.measure_cost.candidates >= 8 and result.measure_cost.seconds > 0


@pytest.mark.slow
def test_task_without_modelled_sketches_falls_back_to_evolutionary(llvm_target, tmp_path, fleet):
    from gradtune.frontend import load_model
    from gradtune.search import make_strategy
    from gradtune.tune import count_records, run_database, tune
    from tests.conftest import EXAMPLES

    model = load_model(EXAMPLES / "transformer_encoder.py")
    _, tasks = partition(model.mod, model.params, llvm_target)
    reshape = [t for t in tasks if t.name == "reshape"]  # one sketch, no decisions at all
    assert reshape
    strategy = make_strategy("gradient")
    result = tune(reshape, llvm_target, tmp_path, fleet, max_trials=2, search=strategy,
                  trials_per_round=2)  # fmt: skip
    assert result.search_summary.fallback_tasks == ["reshape"]
    assert all(r.search is None for r in result.rounds), "evolutionary batches have no search"
    assert count_records(run_database(tmp_path)) >= 1


def test_measured_programs_are_told_apart_by_sketch_and_the_fastest_seed_the_descent(
    llvm_target, small_cnn_conv
):
    """Two sketches of a conv share every sampling instruction and differ in where the output
    is written back: the same decisions are two programs, and a measured trace is matched to
    the sketch it came from, never to the first with the same sampling kinds."""
    from tvm.s_tir import meta_schedule as ms

    from gradtune.search import make_strategy
    from gradtune.search.gradient_search import GradientConfig

    conv = small_cnn_conv
    strategy = make_strategy(
        "gradient",
        config=GradientConfig(seeds=4, elite=0.5, per_seed_first=True, build_at_first_batch=False),
    )
    context = ms.TuneContext(
        mod=conv.mod, target=llvm_target, space_generator="post-order-apply",
        search_strategy="replay-trace", task_name=conv.name, num_threads=2,
    ).clone()  # fmt: skip
    search = strategy
    search._initialize_with_tune_context(context)
    search.pre_tuning(8, 4, context.generate_design_space())
    same_kinds = [[i.kind.name for i in s.variables.sampling_insts] for s in search.sketches]
    assert len(search.sketches) >= 2 and same_kinds[-1] == same_kinds[-2]
    rng = np.random.default_rng(0)
    for k, sym in enumerate(search.sketches):
        decisions = sym.variables.round(sym.variables.random_point(rng))
        trace = sym.replay(decisions).schedule.trace
        assert search._sketch_of(trace) == (k, decisions)
    # The two fastest distinct programs seed the descent (elite = 0.5 of 4 seeds), each in its
    # own sketch, beside random seeds in every sketch.
    history = []
    for k, sym in enumerate(search.sketches):
        for latency in (3.0, 1.0 + k, 5.0):
            history.append((latency, k, sym.variables.round(sym.variables.random_point(rng))))
    search.history = history
    elites = search._elites(2)
    assert sorted((k, len(d)) for k, d in elites.items()) == [(0, 1), (1, 1)]
    assert elites[0][0] is history[1][2] and elites[1][0] is history[4][2]
    seeds = search._seeds(0, search.sketches[0], 2, elites[0])
    encoded = search.sketches[0].variables.encode(elites[0][0])
    assert seeds.shape[0] == 3 and np.abs(seeds[0] - encoded).max() <= 0.3
    assert search._search(4), "a round with elite seeds still yields candidates"
    # warmup: a task's first batch is smaller than the scheduler's, the next ones are not.
    search.config = search.config._replace(warmup=2)
    assert len(search.generate_measure_candidates()) == 2
    assert len(search.generate_measure_candidates()) == 4


def test_evolutionary_explore_fills_the_explore_share_and_learns_from_it(
    llvm_target, small_cnn_conv
):
    """``evolutionary_explore``: up to half of a batch of 8 from MetaSchedule's EvolutionarySearch
    on the scheduler's XGBoost, none of it a program the descent picked; after the batch is
    measured the explorer's programs count as measured and join the history the elites come
    from, and the round says how many it chose and the best latency each side found."""
    from tvm.s_tir import meta_schedule as ms

    from gradtune.search.gradient_search import GradientConfig
    from gradtune.symbolic.sketch import decision_key

    conv = small_cnn_conv
    # The explorer and its half of a batch are the defaults; here it fills a fresh task's first
    # batch too, and the task is set up in pre_tuning.
    config = GradientConfig(seeds=4, steps=4, random_warmup=False, build_at_first_batch=False)
    search, session, context = search_on(conv, llvm_target, config)
    database = ms.database.MemoryDatabase()
    # Without a database and cost model to run it on there is no explorer: Felix's 1 in 8
    # drawn at random instead.
    search.pre_tuning(64, 8, context.generate_design_space())
    assert search.explorer is None and search._explore_share == 0.125
    search.pre_tuning(64, 8, context.generate_design_space(), database, ms.cost_model.XGBModel())
    assert search.explorer is not None and search._explore_share == 0.5
    candidates = search.generate_measure_candidates()
    # Up to half from the explorer (fewer only if what it found was measured); the descent
    # fills the batch.
    evolved = search._explored
    assert len(candidates) == 8 and 1 <= evolved <= 4
    descent = {(k, decision_key(d)) for k, d in search._pending[: 8 - evolved]}
    mapped = [i for i in range(8 - evolved, 8) if search._pending[i][1] is not None]
    assert mapped, "the explorer's programs are of the modelled sketches"
    keys = [(search._pending[i][0], decision_key(search._pending[i][1])) for i in mapped]
    assert not set(keys) & descent and len(set(keys)) == len(keys)
    # Latencies as a runner reports them: one of the explorer's programs the fastest.
    fastest = mapped[-1]
    results = [
        ms.runner.RunnerResult(run_secs=[1e-3 if i == fastest else 2e-3 + 1e-4 * i], error_msg=None)
        for i in range(8)
    ]
    search.notify_runner_results(candidates, results)
    assert set(keys) <= search.measured
    assert min(search.history, key=lambda h: h[0])[2] == search._pending[fastest][1]
    searched = session.take(conv.name)
    assert searched.evolved == evolved
    # Which side found what: the explorer the 1 ms program, the descent its first pick's.
    assert searched.evolved_best_us == pytest.approx(1e3)
    assert searched.descent_best_us == pytest.approx(2e3)


def test_explorer_sits_out_a_batch_the_time_left_cannot_cover(llvm_target, small_cnn_conv):
    """With less of the time budget left than the run's latest evolution and batch took, the
    descent fills the whole batch (1 in 8 at random) and the run counts the skip; with time
    enough, the explorer fills its half and its evolution is timed for the next decision."""
    import time

    from tvm.s_tir import meta_schedule as ms

    from gradtune.search.gradient_search import GradientConfig

    conv = small_cnn_conv
    config = GradientConfig(seeds=4, steps=4, explorer_population=64, random_warmup=False,
                            build_at_first_batch=False)  # fmt: skip
    search, session, context = search_on(conv, llvm_target, config)
    search.pre_tuning(64, 8, context.generate_design_space(), ms.database.MemoryDatabase(),
                      ms.cost_model.XGBModel())  # fmt: skip
    assert search.explorer is not None
    session.deadline = time.perf_counter() + 5.0
    session.explorer_s, session.batch_s = 4.0, 3.0
    assert len(search.generate_measure_candidates()) == 8
    assert search._explored == 0 and search.summary.explorer_skipped == 1
    assert search._explore_share == config.explore
    session.deadline = time.perf_counter() + 600.0
    candidates = search.generate_measure_candidates()
    assert len(candidates) == 8
    assert search._explored >= 1 and search.summary.explorer_skipped == 1
    assert session.explorer_s not in (0.0, 4.0), "the evolution just run, timed"
    results = [ms.runner.RunnerResult(run_secs=[1e-3], error_msg=None)] * 8
    search.notify_runner_results(candidates, results)
    assert session.batch_s not in (0.0, 3.0), "the batch just measured, timed"


def test_explorer_population_halves_above_its_share_of_the_run_and_doubles_far_below():
    """``explorer_time_share``: the population steps by powers of two within its bounds, and
    stays where it is while the evolutions' share of the run is near the target."""
    from gradtune.search.gradient_search import EXPLORER_MIN_POPULATION, resized_population
    from gradtune.search.session import DUTY_WINDOW, Session

    assert resized_population(512, 0.6, 0.25, 512) == 256
    assert resized_population(EXPLORER_MIN_POPULATION, 0.9, 0.25, 512) == EXPLORER_MIN_POPULATION
    assert resized_population(128, 0.05, 0.25, 512) == 256
    assert resized_population(512, 0.05, 0.25, 512) == 512
    assert resized_population(256, 0.2, 0.25, 512) == 256, "between half the share and it"
    assert resized_population(256, None, 0.25, 512) == 256, "too few evolutions to judge"
    session = Session()
    assert session.explorer_duty() is None
    session.evolved(0.0, 3.0)
    assert session.explorer_duty() is None
    session.evolved(9.0, 10.0)
    assert session.explorer_duty() == pytest.approx(4.0 / 10.0)
    for start in range(DUTY_WINDOW):  # only the latest DUTY_WINDOW evolutions count
        session.evolved(100.0 + 10 * start, 101.0 + 10 * start)
    assert session.explorer_duty() == pytest.approx(DUTY_WINDOW / (10.0 * DUTY_WINDOW - 9.0))


def test_explorer_is_rebuilt_at_the_population_its_share_of_the_run_allows(
    llvm_target, small_cnn_conv
):
    """An evolution that follows evolutions taking most of the run halves the population, and
    the task's next evolution runs at it (its round says so); after evolutions that took
    little of the run it doubles back, never past ``explorer_population``."""
    import time

    from tvm.s_tir import meta_schedule as ms

    from gradtune.search.gradient_search import GradientConfig

    config = GradientConfig(seeds=4, steps=4, explorer_population=128, random_warmup=False,
                            build_at_first_batch=False, explorer_time_share=0.5)  # fmt: skip
    search, session, context = search_on(small_cnn_conv, llvm_target, config)
    search.pre_tuning(64, 8, context.generate_design_space(), ms.database.MemoryDatabase(),
                      ms.cost_model.XGBModel())  # fmt: skip
    assert search._population == 128
    now = time.perf_counter()
    session.evolved(now - 100.0, now - 10.0)  # 90 of the last 100 s evolving
    candidates = search.generate_measure_candidates()
    assert search._explored >= 1 and session.explorer_population == 64
    results = [ms.runner.RunnerResult(run_secs=[1e-3], error_msg=None)] * len(candidates)
    search.notify_runner_results(candidates, results)
    assert session.take(small_cnn_conv.name).explorer_population == 128, "evolved at 128"
    session.evolutions.clear()
    now = time.perf_counter()
    session.evolved(now - 1000.0, now - 999.0)  # 1 s of the last 1000
    candidates = search.generate_measure_candidates()
    assert search._population == 64, "rebuilt at the halved population before evolving"
    assert session.explorer_population == 128
    search.notify_runner_results(candidates, results[: len(candidates)])
    assert session.take(small_cnn_conv.name).explorer_population == 64


def test_explorer_sits_out_a_fresh_tasks_first_batch_when_told(llvm_target, small_cnn_conv):
    """``explorer_in_warmup=False``: a task with nothing in the database gets its first batch
    from the descent, 1 in 8 of it drawn at random (``explore``), because the scheduler's
    XGBoost still scores at random; from the second batch the explorer fills its half, with
    the population it was given."""
    from tvm.s_tir import meta_schedule as ms

    from gradtune.search.gradient_search import GradientConfig

    conv = small_cnn_conv
    config = GradientConfig(seeds=4, steps=4, explorer_population=64, explorer_in_warmup=False,
                            random_warmup=False, build_at_first_batch=False)  # fmt: skip
    search, session, context = search_on(conv, llvm_target, config)
    database = ms.database.MemoryDatabase()
    search.pre_tuning(64, 8, context.generate_design_space(), database, ms.cost_model.XGBModel())
    assert search.explorer is not None and search.explorer.population_size == 64
    rounds = []
    for _ in range(2):
        candidates = search.generate_measure_candidates()
        assert len(candidates) == 8
        results = [
            ms.runner.RunnerResult(run_secs=[1e-3 + 1e-4 * i], error_msg=None) for i in range(8)
        ]
        search.notify_runner_results(candidates, results)
        rounds.append(session.take(conv.name))
    assert (rounds[0].evolved, rounds[0].explore_share) == (0, 0.125)
    assert 1 <= rounds[1].evolved <= 4 and rounds[1].explore_share == 0.5


def test_explorer_fills_every_kth_batch_when_told(llvm_target, small_cnn_conv):
    """``explorer_every=2``: the explorer fills its half of the first batch, the descent the
    whole second one (1 in 8 at random), the explorer the third."""
    from tvm.s_tir import meta_schedule as ms

    from gradtune.search.gradient_search import GradientConfig

    with pytest.raises(ValueError, match="explorer_every"):
        search_on(small_cnn_conv, llvm_target, GradientConfig(explorer_every=0))
    config = GradientConfig(
        seeds=4, steps=4, explorer_population=64, explorer_every=2, random_warmup=False
    )
    search, session, context = search_on(small_cnn_conv, llvm_target, config)
    database = ms.database.MemoryDatabase()
    search.pre_tuning(64, 8, context.generate_design_space(), database, ms.cost_model.XGBModel())
    evolved = []
    for _ in range(3):
        candidates = search.generate_measure_candidates()
        results = [
            ms.runner.RunnerResult(run_secs=[1e-3 + 1e-4 * i], error_msg=None)
            for i in range(len(candidates))
        ]
        search.notify_runner_results(candidates, results)
        evolved.append(session.take(small_cnn_conv.name).evolved)
    assert evolved[0] >= 1 and evolved[1] == 0 and evolved[2] >= 1


def test_one_evolution_fills_several_batches_when_told(llvm_target, small_cnn_conv):
    """``batches_per_evolution=2``: the first evolution picks two batches' worth; the second
    batch takes the rest of them without evolving (none handed over twice), the third evolves
    again."""
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms

    from gradtune.search.gradient_search import GradientConfig

    with pytest.raises(ValueError, match="batches_per_evolution"):
        search_on(small_cnn_conv, llvm_target, GradientConfig(batches_per_evolution=0))
    config = GradientConfig(seeds=4, steps=4, explorer_population=64, random_warmup=False,
                            batches_per_evolution=2)  # fmt: skip
    search, session, context = search_on(small_cnn_conv, llvm_target, config)
    search.pre_tuning(64, 8, context.generate_design_space(), ms.database.MemoryDatabase(),
                      ms.cost_model.XGBModel())  # fmt: skip
    rounds, explored = [], []
    for _ in range(3):
        if len(rounds) == 1:
            # What the first evolution left unmeasured: its picks may include a program the
            # descent measured beside them, so the second batch takes what is left of it, not
            # always a whole share.
            left_unmeasured = len(search._unmeasured(search._evolved, 4))
        candidates = search.generate_measure_candidates()
        explored.append(
            {tvm_ffi.structural_hash(c.sch.mod) for c in candidates[-search._explored :]}
        )
        results = [
            ms.runner.RunnerResult(run_secs=[1e-3 + 1e-4 * i], error_msg=None)
            for i in range(len(candidates))
        ]
        search.notify_runner_results(candidates, results)
        rounds.append(session.take(small_cnn_conv.name))
    assert [r.reused for r in rounds] == [False, True, False]
    assert rounds[0].explorer_population == 64 and rounds[1].explorer_population == 0
    # The evolution's seconds are part of the batch's search, and only where it evolved.
    assert 0 < rounds[0].explorer_s <= rounds[0].search_s and rounds[1].explorer_s == 0
    assert rounds[0].evolved == 4 and rounds[1].evolved == left_unmeasured >= 2
    assert not explored[0] & explored[1]


def test_split_by_wins_gives_the_explorer_the_share_of_pairs_its_programs_won(
    llvm_target, small_cnn_conv
):
    """``split_by_wins``: the first evolved batch is split half and half; once the explorer's
    programs have beaten the descent's in every pair, it gets the upper bound (3/4); once the
    descent's win a batch, the share falls to the explorer's win rate over all pairs so far."""
    from tvm.s_tir import meta_schedule as ms

    from gradtune.search.gradient_search import GradientConfig

    config = GradientConfig(seeds=4, steps=4, explorer_population=64, random_warmup=False,
                            split_by_wins=True, build_at_first_batch=False)  # fmt: skip
    search, session, context = search_on(small_cnn_conv, llvm_target, config)
    search.pre_tuning(64, 8, context.generate_design_space(), ms.database.MemoryDatabase(),
                      ms.cost_model.XGBModel())  # fmt: skip
    rounds, splits = [], []
    for explorer_faster in (True, False, False):
        candidates = search.generate_measure_candidates()
        explored = search._explored
        descent = len(candidates) - explored
        fast, slow = (1e-3, 2e-3) if explorer_faster else (2e-3, 1e-3)
        results = [
            ms.runner.RunnerResult(run_secs=[slow if i < descent else fast], error_msg=None)
            for i in range(len(candidates))
        ]
        search.notify_runner_results(candidates, results)
        rounds.append(session.take(small_cnn_conv.name))
        splits.append((explored, descent))
    assert rounds[0].explore_share == 0.5 and 1 <= splits[0][0] <= 4
    assert rounds[1].explore_share == 0.75 and 1 <= splits[1][0] <= 6
    won = splits[0][0] * splits[0][1]
    expected = won / (won + splits[1][0] * splits[1][1])
    assert rounds[2].explore_share == pytest.approx(max(0.25, expected))


class _ExplorerSpy:
    """The real explorer, with a record of what the search asked of it."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def generate_measure_candidates(self):
        self.calls.append("generate")
        return self.inner.generate_measure_candidates()

    def notify_runner_results(self, candidates, results):
        self.calls.append("notify")
        self.inner.notify_runner_results(candidates, results)

    def post_tuning(self):
        self.inner.post_tuning()


def test_random_warmup_draws_a_fresh_tasks_first_explore_share_without_evolving(
    llvm_target, small_cnn_conv
):
    """``random_warmup`` (the default): the explore share of a fresh task's first batch is random
    programs of its design space, and the explorer neither evolves for it nor hears of it; from
    the second batch on the explorer fills its share as before."""
    from tvm.s_tir import meta_schedule as ms

    from gradtune.search.gradient_search import GradientConfig
    from gradtune.symbolic.sketch import decision_key

    config = GradientConfig(seeds=4, steps=4, explorer_population=64, build_at_first_batch=False)
    search, session, context = search_on(small_cnn_conv, llvm_target, config)
    search.pre_tuning(64, 8, context.generate_design_space(), ms.database.MemoryDatabase(),
                      ms.cost_model.XGBModel())  # fmt: skip
    search.explorer = spy = _ExplorerSpy(search.explorer)
    rounds, handed = [], []
    for _ in range(2):
        candidates = search.generate_measure_candidates()
        assert len(candidates) == 8
        handed.append(list(search._pending))  # (sketch, decisions); None outside the sketches
        results = [
            ms.runner.RunnerResult(run_secs=[1e-3 + 1e-4 * i], error_msg=None)
            for i in range(len(candidates))
        ]
        search.notify_runner_results(candidates, results)
        rounds.append(session.take(small_cnn_conv.name))
    assert rounds[0].sampled and rounds[0].evolved >= 1
    assert not rounds[1].sampled and rounds[1].evolved >= 1
    assert spy.calls == ["generate", "notify"]
    # The random programs count as measured too. A program can fall outside the modelled
    # sketches (no decisions to key it by: MetaSchedule's evolution hands over simplified
    # traces), so the count is of those that have them.
    sampled = handed[0][8 - rounds[0].evolved :]
    assert any(d is not None for _, d in sampled)
    assert search.measured == {
        (k, decision_key(d)) for batch in handed for k, d in batch if d is not None
    }
    search.post_tuning()


def database_of_spaces(task, target, spaces):
    """A database holding each of ``spaces`` as a measured program of ``task`` (1, 2, ... ms),
    as a warm start's transfer or a resumed run leaves it."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    database = ms.database.MemoryDatabase()
    workload = database.commit_workload(task.mod)
    args = ms.arg_info.ArgInfo.from_prim_func(task.mod["main"])
    for i, space in enumerate(spaces):
        sch = tvm.s_tir.Schedule(task.mod)
        space.trace.apply_to_schedule(sch, remove_postproc=False)
        record = ms.database.TuningRecord(sch.trace, workload, [1e-3 * (i + 1)], target, args)
        database.commit_tuning_record(record)
    return database


def test_warm_warmup_shortens_the_first_batch_only_of_a_task_with_measured_programs(
    llvm_target, small_cnn_conv
):
    """``warm_warmup``: a task the database held programs of gets that many candidates first,
    then whole batches; a task it held none of keeps a whole first batch."""
    from tvm.s_tir import meta_schedule as ms

    from gradtune.search.gradient_search import GradientConfig

    config = GradientConfig(seeds=4, steps=4, evolutionary_explore=False, warm_warmup=3,
                            build_at_first_batch=False)  # fmt: skip
    search, _, context = search_on(small_cnn_conv, llvm_target, config)
    spaces = context.generate_design_space()
    database = database_of_spaces(small_cnn_conv, llvm_target, spaces)
    search.pre_tuning(64, 8, spaces, database, ms.cost_model.XGBModel())
    assert len(search.generate_measure_candidates()) == 3
    assert len(search.generate_measure_candidates()) == 8
    search, _, context = search_on(small_cnn_conv, llvm_target, config)
    search.pre_tuning(64, 8, context.generate_design_space())
    assert len(search.generate_measure_candidates()) == 8


def test_random_warmup_holds_when_the_database_already_has_programs_of_the_task(
    llvm_target, small_cnn_conv
):
    """A warm start (or a resumed run) puts programs of the task in the database before its
    first batch. The descent seeds from them; the explore share is still random draws, not
    an evolution that XGBoost could only score at random."""
    from tvm.s_tir import meta_schedule as ms

    from gradtune.search.gradient_search import GradientConfig

    config = GradientConfig(seeds=4, steps=4, explorer_population=64, build_at_first_batch=False)
    search, session, context = search_on(small_cnn_conv, llvm_target, config)
    spaces = context.generate_design_space()
    database = database_of_spaces(small_cnn_conv, llvm_target, spaces)
    search.pre_tuning(64, 8, spaces, database, ms.cost_model.XGBModel())
    assert search.history, "the database's programs were read as measured"
    search.explorer = spy = _ExplorerSpy(search.explorer)
    candidates = search.generate_measure_candidates()
    search.notify_runner_results(
        candidates, [ms.runner.RunnerResult(run_secs=[1e-3], error_msg=None) for _ in candidates]
    )
    first = session.take(small_cnn_conv.name)
    assert first.sampled and "generate" not in spy.calls
    search.post_tuning()


def test_warm_explore_off_leaves_a_warm_tasks_first_batch_to_the_descent_only(
    llvm_target, small_cnn_conv
):
    """``warm_explore=False``: the first batch of a task the database held programs of has no
    explorer's share (neither random draws nor an evolution); its next batch has one again,
    and a task the database held nothing of still gets random draws first."""
    from tvm.s_tir import meta_schedule as ms

    from gradtune.search.gradient_search import GradientConfig

    config = GradientConfig(seeds=4, steps=4, explorer_population=64, warm_explore=False,
                            build_at_first_batch=False)  # fmt: skip
    search, session, context = search_on(small_cnn_conv, llvm_target, config)
    spaces = context.generate_design_space()
    database = database_of_spaces(small_cnn_conv, llvm_target, spaces)
    search.pre_tuning(64, 8, spaces, database, ms.cost_model.XGBModel())
    search.explorer = spy = _ExplorerSpy(search.explorer)
    rounds = []
    for _ in range(2):
        candidates = search.generate_measure_candidates()
        results = [ms.runner.RunnerResult(run_secs=[1e-3], error_msg=None) for _ in candidates]
        search.notify_runner_results(candidates, results)
        rounds.append(session.take(small_cnn_conv.name))
    assert not rounds[0].sampled and rounds[0].evolved == 0
    assert rounds[1].evolved >= 1 and spy.calls[0] == "generate"
    search.post_tuning()
    search, session, context = search_on(small_cnn_conv, llvm_target, config)
    search.pre_tuning(64, 8, context.generate_design_space(), ms.database.MemoryDatabase(),
                      ms.cost_model.XGBModel())  # fmt: skip
    candidates = search.generate_measure_candidates()
    results = [ms.runner.RunnerResult(run_secs=[1e-3], error_msg=None) for _ in candidates]
    search.notify_runner_results(candidates, results)
    assert session.take(small_cnn_conv.name).sampled
    search.post_tuning()


def test_ranked_warmup_keeps_the_best_ranked_random_programs_once_the_ranker_is_trained(
    llvm_target, small_cnn_conv
):
    """``ranked_warmup``: until the run has measured 100 programs a fresh task's first explore
    share is the first random programs drawn, unranked; after, it is the best of
    ``ranked_warmup`` draws as the task scheduler's cost model (a trained XGBoost) scores them,
    and the round says so."""
    from tvm.s_tir import meta_schedule as ms

    from gradtune.search.gradient_search import RANKER_TRAINED_AT, GradientConfig

    class Recorder:
        """The real XGBoost, with a record of what it scored."""

        def __init__(self, inner):
            self.inner, self.scored = inner, []

        def predict(self, context, candidates):
            scores = self.inner.predict(context, candidates)
            self.scored.append((candidates, scores))
            return scores

    config = GradientConfig(seeds=4, steps=4, explorer_population=64, ranked_warmup=24,
                            build_at_first_batch=False)  # fmt: skip
    xgb = ms.cost_model.XGBModel(num_warmup_samples=0, adaptive_training=False)
    ranker = Recorder(xgb)
    search, session, context = search_on(small_cnn_conv, llvm_target, config)
    design_spaces = context.generate_design_space()
    search.pre_tuning(64, 8, design_spaces, ms.database.MemoryDatabase(), xgb)
    search.ranker = ranker
    candidates = search.generate_measure_candidates()
    results = [
        ms.runner.RunnerResult(run_secs=[1e-3 + 1e-4 * i], error_msg=None)
        for i in range(len(candidates))
    ]
    search.notify_runner_results(candidates, results)
    first = session.take(small_cnn_conv.name)
    assert first.sampled and not first.ranked and not ranker.scored
    assert session.measured == len(candidates)
    xgb.update(context, candidates, results)

    # Another fresh task of the same run, once the run has measured enough programs.
    session.measured = RANKER_TRAINED_AT
    fresh, _, _ = search_on(small_cnn_conv, llvm_target, config)
    fresh.attach(session)
    fresh._initialize_with_tune_context(context)
    fresh.pre_tuning(64, 8, design_spaces, ms.database.MemoryDatabase(), xgb)
    fresh.ranker = ranker
    candidates = fresh.generate_measure_candidates()
    assert len(ranker.scored) == 1
    drawn, scores = ranker.scored[0]
    assert len(drawn) == 24 and fresh._explored >= 1
    # The explore share (the batch's last candidates) is the best-scored distinct draws, in
    # that order.
    chosen = [str(p.sch.trace) for p in candidates[-fresh._explored :]]
    order = np.argsort(-np.asarray(scores), kind="stable")
    best_first = list(dict.fromkeys(str(drawn[i].sch.trace) for i in order))
    assert chosen == best_first[: len(chosen)]
    results = [ms.runner.RunnerResult(run_secs=[1e-3], error_msg=None)] * len(candidates)
    fresh.notify_runner_results(candidates, results)
    assert session.take(small_cnn_conv.name).ranked


def test_sketches_are_built_at_a_tasks_first_batch(llvm_target, small_cnn_conv):
    """``build_at_first_batch`` (the default): ``pre_tuning`` (which MetaSchedule calls for every
    task before any batch) only keeps its arguments; the task's first request for a batch
    builds its sketches and explorer, then hands over the batch."""
    from tvm.s_tir import meta_schedule as ms

    from gradtune.search.gradient_search import GradientConfig

    config = GradientConfig(seeds=4, steps=4, explorer_population=64)
    search, _, context = search_on(small_cnn_conv, llvm_target, config)
    search.pre_tuning(64, 8, context.generate_design_space(), ms.database.MemoryDatabase(),
                      ms.cost_model.XGBModel())  # fmt: skip
    assert search.sketches == [] and search.explorer is None and search.remaining == 64
    candidates = search.generate_measure_candidates()
    assert search.sketches and search.explorer is not None and search._setup_args is None
    assert len(candidates) == 8
    # A stop that arrives while a task's sketches are built (seconds) ends the task there: no
    # batch is searched, built and measured first (the CLI gives a stopping run 5 s).
    search, session, context = search_on(small_cnn_conv, llvm_target, config)
    search.pre_tuning(64, 8, context.generate_design_space())
    build = search._setup

    def build_then_stop(*args):
        build(*args)
        session.stop.set()

    search._setup = build_then_stop
    assert search.generate_measure_candidates() is None and search.sketches


def test_first_batch_is_sized_by_the_tasks_share_of_the_model_latency(llvm_target, small_cnn_conv):
    """``warmup_by_share``: a task that is 5% of a two-task model's latency at its default
    schedules gets 2 of 8 candidates (⌈2 · 0.05 · 8⌉, at least 2) first, then whole batches;
    a task the loop measured nothing of keeps a whole first batch."""
    from types import SimpleNamespace

    from gradtune.search.gradient_search import GradientConfig
    from gradtune.tune import latency_shares

    tasks = [SimpleNamespace(name=n, weight=w) for n, w in (("a", 1), ("b", 3), ("c", 1))]
    shares = latency_shares(tasks, {"a": 10.0, "b": 30.0, "c": math.inf})
    assert shares == pytest.approx({"a": 0.1, "b": 0.9})

    conv = small_cnn_conv
    config = GradientConfig(seeds=4, steps=4, evolutionary_explore=False, warmup_by_share=True)
    search, session, context = search_on(conv, llvm_target, config)
    search.pre_tuning(64, 8, context.generate_design_space())
    session.latency_shares = {conv.name: 0.05, "other": 0.95}
    assert len(search.generate_measure_candidates()) == 2
    assert len(search.generate_measure_candidates()) == 8
    search, session, context = search_on(conv, llvm_target, config)
    search.pre_tuning(64, 8, context.generate_design_space())
    session.latency_shares = {"other": 1.0}
    assert len(search.generate_measure_candidates()) == 8


def test_ensemble_ei_and_contextual_explore_choose_the_batch(llvm_target, small_cnn_conv):
    """AdaTune on Felix: the descent climbs log EI of a four-member ensemble over the task's
    best measured program, and the round's explore share is Eq. 3, clamped and logged. A member
    gone wild (NaN) is left out and counted, and no pick carries a NaN."""
    from tvm.s_tir import meta_schedule as ms

    from gradtune.costmodel.ensemble import Scale
    from gradtune.costmodel.model import load
    from gradtune.costmodel.online import OnlineCostModel, bundled_path
    from gradtune.search import make_strategy
    from gradtune.search.gradient_search import GradientConfig
    from gradtune.search.session import Session

    members = [load(bundled_path()) for _ in range(4)]
    for k, member in enumerate(members[1:], start=1):  # apart as independently seeded members
        generator = torch.Generator().manual_seed(k)
        with torch.no_grad():
            for p in member.parameters():
                p.add_(0.1 * p.abs().mean() * torch.randn(p.shape, generator=generator))
    cost_model = OnlineCostModel(members[0], members=members, epochs=1)
    config = GradientConfig(seeds=4, steps=4, acquisition="ei", contextual_explore=True)
    search = make_strategy("gradient", cost_model=cost_model, config=config)
    session = Session()
    search.attach(session)
    conv = small_cnn_conv
    context = ms.TuneContext(
        mod=conv.mod, target=llvm_target, space_generator="post-order-apply",
        search_strategy="replay-trace", task_name=conv.name, num_threads=2,
    ).clone()  # fmt: skip
    search._initialize_with_tune_context(context)
    search.pre_tuning(64, 8, context.generate_design_space(), ms.database.MemoryDatabase())
    candidates = search.generate_measure_candidates()
    assert len(candidates) == 8
    assert 0.05 <= search._explore_share <= 0.5 and search._mean_sigma > 0
    assert all(math.isfinite(s) for s in search._pending_scores)
    results = [ms.runner.RunnerResult(run_secs=[1e-3 * (1 + i)], error_msg=None) for i in range(8)]
    search.notify_runner_results(candidates, results)
    logged = session.take(conv.name)
    assert logged.explore_share == search._explore_share and logged.mean_sigma > 0
    # The next round's incumbent is the ensemble's μ at the fastest measured program.
    search.generate_measure_candidates()
    best = search._best_measured()
    with torch.no_grad():
        mu, _, _ = search._scale.mu_sigma(cost_model.member_scores([best]))
    assert search._incumbent == pytest.approx(float(mu[0]))
    assert search.history and best is not None
    with torch.no_grad():
        members[3].head.bias.fill_(math.nan)
    assert search.generate_measure_candidates()
    assert search._dropped_members > 0 and search.summary.dropped_members > 0
    assert all(math.isfinite(s) for s in search._pending_scores)
    assert isinstance(search._scale, Scale)
    with pytest.raises(ValueError, match="ensemble"):
        make_strategy("gradient", config=GradientConfig(acquisition="ei"))


def test_rank_share_puts_the_highest_at_one_and_ties_on_their_mean():
    from gradtune.search.gradient_search import rank_share

    assert rank_share(np.array([0.2, 5.0, -1.0])).tolist() == [0.5, 1.0, 0.0]
    assert rank_share(np.array([3.0, 3.0, 1.0])).tolist() == [0.75, 0.75, 0.0]
    assert rank_share(np.array([7.0])).tolist() == [1.0]


def test_ranker_blend_ranks_the_descents_picks_by_the_trained_ranker_too(
    llvm_target, small_cnn_conv
):
    """``ranker_blend=1``: once the run has measured ``RANKER_TRAINED_AT`` programs, the
    descent's picks are the candidates the task scheduler's cost model ranks best, not the
    MLP's; before that, and at the default 0, the ranker is not asked. The round logs how
    well the ranker ranked the picks it was asked about."""
    from tvm.s_tir import meta_schedule as ms

    from gradtune.search.gradient_search import RANKER_TRAINED_AT, GradientConfig

    class Reversed:
        """A ranker that scores the MLP's favourites worst: its own order must win."""

        def __init__(self):
            self.asked, self.n = 0, 0

        def predict(self, context, candidates):
            self.asked, self.n = self.asked + 1, len(candidates)
            return np.arange(self.n, dtype=float)  # the last candidate best

    with pytest.raises(ValueError, match="ranker_blend"):
        search_on(small_cnn_conv, llvm_target, GradientConfig(ranker_blend=1.5))
    for blend, trained in [(0.0, True), (1.0, False), (1.0, True)]:
        config = GradientConfig(seeds=4, steps=4, evolutionary_explore=False,
                                structural_variants=0, ranker_blend=blend,
                                build_at_first_batch=False)  # fmt: skip
        search, session, context = search_on(small_cnn_conv, llvm_target, config)
        search.pre_tuning(64, 8, context.generate_design_space(), ms.database.MemoryDatabase())
        search.ranker = ranker = Reversed()
        session.measured = RANKER_TRAINED_AT if trained else 0
        seen = {}
        pick = search._pick

        def spy(fresh, count, pick=pick, seen=seen):
            seen["fresh"] = len(fresh)
            return pick(fresh, count)

        search._pick = spy
        candidates = search.generate_measure_candidates()
        assert ranker.asked == (1 if blend > 0 and trained else 0), (blend, trained)
        assert seen["fresh"] > len(candidates)  # there was a choice to make
        results = [ms.runner.RunnerResult(run_secs=[1e-3 * (1 + i)], error_msg=None)
                   for i in range(len(candidates))]  # fmt: skip
        search.notify_runner_results(candidates, results)
        round_ = session.take(small_cnn_conv.name)
        assert round_.reranked is (ranker.asked == 1)
        if round_.reranked:
            # The picks but the last (the explore share, drawn from the rest) are the
            # candidates the ranker scored best, best first; measured fastest first, so the
            # ranker ranked the batch perfectly.
            n, exploit = ranker.n, len(candidates) - 1
            assert search._picked_ranker[:exploit] == [float(n - 1 - i) for i in range(exploit)]
            assert round_.ranker_spearman == pytest.approx(1.0)
        else:
            assert math.isnan(round_.ranker_spearman)
