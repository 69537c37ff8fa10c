"""Structural variants: a measured program's one-thread and whole-register neighbours, checked
on the programs TVM builds from them, and measured in place of the descent's last picks."""

import numpy as np
import pytest

from tests.conftest import search_on


@pytest.mark.parametrize(
    ("target", "lanes"),
    [
        ({"kind": "llvm", "mcpu": "emeraldrapids"}, 16),
        ({"kind": "llvm", "mcpu": "znver4"}, 16),
        ({"kind": "llvm", "mcpu": "haswell"}, 8),
        ({"kind": "llvm", "mtriple": "aarch64-linux-gnu"}, 4),
        ({"kind": "cuda", "arch": "sm_80"}, 0),
    ],
)
def test_register_lanes_follow_the_targets_vector_unit(target, lanes):
    import tvm

    from gradtune.search.structural import register_lanes

    assert register_lanes(tvm.target.Target(target)) == lanes


def test_vec_and_par_read_the_loops_around_the_reduction():
    """A program's other stages are vectorized and parallelized on their own: the extents are
    those of the loops around its reduction, and of all loops where there is none."""
    import tvm
    from tvm import te

    from gradtune.search.structural import vec_and_par

    a = te.placeholder((24, 80), name="a")
    b = te.compute((24, 80), lambda i, j: a[i, j] * 2.0, name="b")
    k = te.reduce_axis((0, 80), name="k")
    c = te.compute((24, 24), lambda i, j: te.sum(b[i, k] * b[j, k], axis=k), name="c")
    func = te.create_prim_func([a, c])
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    i, j = sch.get_loops(sch.get_sblock("b"))
    _, ji = sch.split(j, factors=[None, 16])
    sch.parallel(i)
    sch.vectorize(ji)
    assert vec_and_par(sch.mod) == (1, 1)
    i, j, _ = sch.get_loops(sch.get_sblock("c"))
    _, ji = sch.split(j, factors=[None, 8])
    sch.parallel(i)
    sch.vectorize(ji)
    assert vec_and_par(sch.mod) == (8, 24)
    elementwise = tvm.s_tir.Schedule(tvm.IRModule({"main": te.create_prim_func([a, b])}))
    i, j = elementwise.get_loops(elementwise.get_sblock("b"))
    _, ji = elementwise.split(j, factors=[None, 16])
    elementwise.parallel(i)
    elementwise.vectorize(ji)
    assert vec_and_par(elementwise.mod) == (16, 24)
    assert vec_and_par(tvm.IRModule({"main": func})) == (1, 1)


def test_aligned_means_whole_registers_and_on_avx512_whole_avx2_registers_too():
    from gradtune.search.structural import aligned

    widths = (1, 4, 8, 10, 16, 19, 24, 32, 40, 64)
    assert [v for v in widths if aligned(v, 16)] == [8, 16, 24, 32, 40, 64]
    assert [v for v in widths if aligned(v, 8)] == [8, 16, 24, 32, 40, 64]
    assert [v for v in widths if aligned(v, 4)] == [4, 8, 16, 24, 32, 40, 64]


def _parallel_unaligned(sym, rng):
    """Decisions of ``sym`` whose program runs in parallel with a partial vector."""
    from gradtune.search.structural import aligned, vec_and_par

    for _ in range(200):
        decisions = sym.variables.round(sym.variables.random_point(rng))
        probe = sym.replay(decisions)
        if probe is not None:
            vec, par = vec_and_par(probe.schedule.mod)
            if par > 1 and not aligned(vec, 16):
                return decisions
    raise AssertionError("no parallel program with a partial vector in 200 draws")


def test_variants_run_on_one_thread_or_fill_whole_registers(llvm_target, small_cnn_conv):
    """Each variant changes only tile decisions, and the program TVM builds from it has the
    property it was made for; the cache answers the second ask without a replay."""
    from gradtune.search.structural import StructuralNeighbours, aligned, vec_and_par
    from gradtune.symbolic.sketch import SymbolicSketch

    _, _, context = search_on(small_cnn_conv, llvm_target, None)
    space = context.generate_design_space()[0]
    postprocs = list(context.space_generator.postprocs)
    rng = np.random.default_rng(0)
    sym = SymbolicSketch.build(small_cnn_conv.mod, space.trace, postprocs, False, rng=rng)
    decisions = _parallel_unaligned(sym, rng)
    neighbours = StructuralNeighbours(16)
    variants = neighbours.variants(0, sym, decisions)
    assert variants, "a parallel program with a partial vector has variants"
    shapes = []
    for variant in variants:
        assert variant.keys() == decisions.keys() and variant != decisions
        for var in sym.variables.tiles:
            assert np.prod(variant[var.index]) == var.extent  # still a perfect tiling
        for var in sym.variables.categoricals:
            assert variant[var.index] == decisions[var.index]
        vec, par = vec_and_par(sym.replay(variant).schedule.mod)
        shapes.append((vec, par))
        assert par == 1 or aligned(vec, 16)
    # The one-thread variant comes first: it moves the outer factors only.
    assert shapes[0][1] == 1 or all(aligned(v, 16) for v, _ in shapes)
    probes = sym.probes
    assert neighbours.variants(0, sym, decisions) == variants and sym.probes == probes
    # Without the one-thread variant (``one_thread_below_us`` of a slower program): the
    # whole-register ones alone, from the same cache.
    whole = neighbours.variants(0, sym, decisions, one_thread=False)
    dropped = len(variants) - len(whole)
    assert dropped in (0, 1) and whole == variants[dropped:] and sym.probes == probes
    assert all(aligned(vec, 16) for vec, _ in shapes[dropped:])
    assert dropped == 0 or shapes[0][1] == 1


def test_variants_replace_the_descents_last_picks_after_a_tasks_first_batch(
    llvm_target, small_cnn_conv
):
    """With ``structural_variants=2``: none in a task's first batch; in the next, the last two
    of the descent's picks are unmeasured variants of the fastest measured programs, and the
    round says how many there were and the best latency they reached."""
    from tvm.s_tir import meta_schedule as ms

    from gradtune.search.gradient_search import GradientConfig
    from gradtune.symbolic.sketch import decision_key

    config = GradientConfig(
        seeds=4, steps=4, evolutionary_explore=False, structural_variants=2,
        build_at_first_batch=False,
    )  # fmt: skip
    search, session, context = search_on(small_cnn_conv, llvm_target, config)
    search.pre_tuning(64, 8, context.generate_design_space())
    assert search.structural is not None and search.structural.lanes in (4, 8, 16)
    first = search.generate_measure_candidates()
    assert search._structural == 0
    # The fastest measured program: one that runs in parallel with a partial vector.
    rng = np.random.default_rng(1)
    lanes = search.structural.lanes
    elite = None
    for _ in range(200):
        k = int(rng.integers(len(search.sketches)))
        decisions = search.sketches[k].variables.round(
            search.sketches[k].variables.random_point(rng)
        )
        if search.structural.variants(k, search.sketches[k], decisions):
            elite = (k, decisions)
            break
    assert elite is not None, f"no program with variants at {lanes} lanes in 200 draws"
    # The first batch failed to run: the elite is the only measured program.
    results = [ms.runner.RunnerResult(run_secs=None, error_msg="timeout") for _ in first]
    search.notify_runner_results(first, results)
    assert not search.history
    search.history.append((1e-3, *elite))
    # ``one_thread_below_us`` under the elite's 1 ms: its one-thread variant is not asked for.
    k, sym = elite[0], search.sketches[elite[0]]
    serial = {decision_key(v) for v in search.structural.variants(k, sym, elite[1])} - {
        decision_key(v) for v in search.structural.variants(k, sym, elite[1], one_thread=False)
    }
    every = {decision_key(v) for _, v, _ in search._variants(8, set())}
    search.config = search.config._replace(one_thread_below_us=100.0)
    assert {decision_key(v) for _, v, _ in search._variants(8, set())} == every - serial
    search.config = search.config._replace(one_thread_below_us=0.0)
    candidates = search.generate_measure_candidates()
    assert len(candidates) == 8
    k = elite[0]
    expected = {(k, decision_key(v)) for v in search.structural.variants(k, search.sketches[k],
                                                                         elite[1])}  # fmt: skip
    tail = {(k, decision_key(d)) for k, d in search._pending[8 - search._structural : 8]}
    assert 1 <= search._structural <= 2 and tail <= expected
    assert not tail & search.measured
    fast = [5e-4 if i >= 8 - search._structural else 3e-3 for i in range(8)]
    search.notify_runner_results(
        candidates, [ms.runner.RunnerResult(run_secs=[s], error_msg=None) for s in fast]
    )
    searched = session.take(small_cnn_conv.name)
    assert searched.structural == search._structural
    assert searched.structural_best_us == pytest.approx(500.0)
    # A batch the trial budget cuts to one candidate holds one, however many variants the
    # fastest program has (they once came on top: `--trials 8` measured 63).
    for _ in range(200):
        k = int(rng.integers(len(search.sketches)))
        decisions = search.sketches[k].variables.round(
            search.sketches[k].variables.random_point(rng)
        )
        variants = search.structural.variants(k, search.sketches[k], decisions)
        if len({(k, decision_key(v)) for v in variants} - search.measured) >= 2:
            break
    search.history.append((1e-4, k, decisions))
    session.trials_left = 1
    assert len(search.generate_measure_candidates()) == 1 and search._structural == 1
    # A small batch gives variants a quarter of the descent's places, as the CLI's batch of 25
    # does (3 of 13), not all but one: ``./run``'s batch of 8 leaves the descent 4.
    search.history.append((1e-5, k, decisions))
    session.trials_left = 5
    assert len(search.generate_measure_candidates()) == 5 and search._structural == 1
