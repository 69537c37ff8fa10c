"""Sketch variables: every point decodes to a valid trace, and TVM keeps our decisions."""

import itertools
import math

import numpy as np
import pytest

from gradtune.symbolic.variables import CategoricalVar, SketchVariables, TileVar, prime_factors


def test_prime_factors():
    assert prime_factors(96) == {2: 5, 3: 1}
    assert prime_factors(97) == {97: 1}
    assert prime_factors(1) == {}


def test_tile_rounding_is_always_a_perfect_tiling_within_max_innermost():
    var = TileVar(index=0, extent=96, n=4, max_innermost=8, primes=[2, 3], totals=[5, 1])
    rng = np.random.default_rng(0)
    for _ in range(500):
        factors = var.round(rng.normal(0, 3, var.size))
        assert np.prod(factors) == 96 and all(f >= 1 for f in factors)
        assert factors[-1] <= 8
    assert var.round(var.encode([3, 2, 4, 4])) == [3, 2, 4, 4]


def test_tilings_are_every_tiling_rounding_gives_and_the_space_is_their_product():
    var = TileVar(index=0, extent=96, n=4, max_innermost=8, primes=[2, 3], totals=[5, 1])
    tilings = {tuple(t) for t in var.tilings()}
    brute = itertools.product([d for d in range(1, 97) if 96 % d == 0], repeat=4)
    assert tilings == {t for t in brute if math.prod(t) == 96 and t[-1] <= 8}
    assert len(tilings) == len(var.tilings())
    assert all(tuple(var.round(var.encode(list(t)))) == t for t in tilings)
    rng = np.random.default_rng(1)
    assert all(tuple(var.round(rng.uniform(-1, 6, var.size))) in tilings for _ in range(500))
    cat = CategoricalVar(index=1, candidates=[0, 16, 64, 512])
    variables = SketchVariables(trace=None, tiles=[var], categoricals=[cat])
    every = variables.every_decision(len(tilings) * 4)
    assert len(every) == len(tilings) * 4
    assert {(tuple(d[0]), d[1]) for d in every} == {(t, c) for t in tilings for c in range(4)}
    assert variables.every_decision(len(tilings) * 4 - 1) is None


def test_categorical_snaps_to_nearest_candidate_in_log_space():
    var = CategoricalVar(index=0, candidates=[0, 16, 64, 512])
    assert var.round(np.array([np.log2(17) + 0.4])) == 1
    assert var.round(np.array([-5.0])) == 0 and var.round(np.array([99.0])) == 3
    assert all(var.round(var.encode(i)) == i for i in range(4))


@pytest.fixture(scope="module")
def matmul_space():
    import tvm
    from tvm import te
    from tvm.s_tir import meta_schedule as ms

    from gradtune.tvm_compat import register_tensor_intrinsics

    register_tensor_intrinsics("llvm")
    a = te.placeholder((64, 96), name="A")
    b = te.placeholder((96, 128), name="B")
    k = te.reduce_axis((0, 96), name="k")
    c = te.compute((64, 128), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    mod = tvm.IRModule({"main": te.create_prim_func([a, b, c])})
    target = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    ctx = ms.TuneContext(mod=mod, target=target, space_generator="post-order-apply", task_name="mm")
    return mod, ctx.generate_design_space(), list(ctx.space_generator.postprocs)


def test_decode_applies_exactly_the_rounded_decisions(matmul_space):
    mod, sketches, postprocs = matmul_space
    rng = np.random.default_rng(1)
    for sketch in sketches:
        variables = SketchVariables.from_trace(sketch.trace)
        assert variables.tiles and variables.categoricals
        assert variables.encode(variables.sketch_decisions()).shape == (variables.dim,)
        for _ in range(10):
            x = variables.random_point(rng)
            sch, applied = variables.decode(mod, x, postprocs)
            assert sch is not None, "a decoded point was rejected by the postprocessors"
            assert applied == variables.round(x), "TVM repaired a decision we thought valid"


def test_decode_rejects_wrong_dimension(matmul_space):
    mod, sketches, _ = matmul_space
    variables = SketchVariables.from_trace(sketches[0].trace)
    with pytest.raises(ValueError, match="variables"):
        variables.decode(mod, np.zeros(variables.dim + 1))


def test_decoded_trace_marks_where_the_postprocessors_begin(matmul_space):
    """MetaSchedule's evolutionary search replays the database's traces with
    remove_postproc=True after mutating them; unmarked, the postprocessors' instructions would be
    replayed as if they were the sketch's (and TVM aborts once a decision changes a loop count)."""
    mod, sketches, postprocs = matmul_space
    rng = np.random.default_rng(2)
    for sketch in sketches:
        variables = SketchVariables.from_trace(sketch.trace)
        sch, _ = variables.decode(mod, variables.random_point(rng), postprocs)
        kinds = [inst.kind.name for inst in sch.trace.insts]
        assert kinds.count("EnterPostproc") == 1
        assert kinds.index("EnterPostproc") >= len(sketch.trace.insts)
        sketch_part = sch.trace.simplified(remove_postproc=True)
        assert "EnterPostproc" not in [inst.kind.name for inst in sketch_part.insts]
        assert len(sketch_part.insts) <= len(sketch.trace.insts)
