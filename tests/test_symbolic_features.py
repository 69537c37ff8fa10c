"""Feature formulas: the port reproduces TVM's PerStoreFeature, the fitted formulas reproduce
it on held-out decisions, and the smooth mode is differentiable."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from gradtune.symbolic.formulas import fit_leaf
from tests.conftest import run_cli

OPS = Path(__file__).parent / "ops"


def test_fit_leaf_finds_each_closed_form_and_refuses_the_rest():
    rng = np.random.default_rng(0)
    factors = rng.choice([1, 2, 3, 4, 8], size=(12, 3)).astype(float)
    log_f, cats = np.log(factors), rng.choice([0, 16, 64], size=(12, 1)).astype(float)
    mono = 96 / (factors[:, 0] * factors[:, 2])
    fitted = fit_leaf(log_f, cats, mono)
    assert fitted.kind == "mono" and list(fitted.exps) == [-1, 0, -1]
    halo = 2 * factors[:, 1] + 1  # (tile − 1) · stride + kernel, stride 2, kernel 3
    assert fit_leaf(log_f, cats, halo).kind == "affine"
    assert fit_leaf(log_f, cats, np.full(12, 7.0)).kind == "const"
    assert fit_leaf(log_f, cats, cats[:, 0]).kind == "cat"
    assert fit_leaf(log_f, cats, factors[:, 0] + factors[:, 1]) is None
    values = torch.as_tensor(log_f)
    assert torch.allclose(fitted.evaluate(values, torch.as_tensor(cats)), torch.as_tensor(mono))


@pytest.fixture(scope="module")
def matmul_task():
    import tvm
    from tvm import te

    from gradtune.symbolic.verify import design_space

    a = te.placeholder((64, 96), name="A")
    b = te.placeholder((96, 128), name="B")
    k = te.reduce_axis((0, 96), name="k")
    c = te.compute((64, 128), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    d = te.compute((64, 128), lambda i, j: te.max(c[i, j], 0.0), name="D")
    mod = tvm.IRModule({"main": te.create_prim_func([a, b, d])})
    target = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    return (mod, target, *design_space(mod, target))


def test_port_reproduces_per_store_feature_exactly(matmul_task):
    from tvm.s_tir import meta_schedule as ms

    from gradtune.symbolic.features import evaluate
    from gradtune.symbolic.program import extract_program
    from gradtune.symbolic.variables import SketchVariables

    mod, _, ctx, sketches, postprocs = matmul_task
    extractor = ms.feature_extractor.PerStoreFeature()
    args = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    rng = np.random.default_rng(0)
    checked = 0
    for sketch in sketches:
        variables = SketchVariables.from_trace(sketch.trace)
        for _ in range(4):
            sch, _ = variables.decode(mod, variables.random_point(rng), postprocs)
            if sch is None:
                continue
            ref = extractor.extract_from(ctx, [ms.MeasureCandidate(sch, args)])[0].numpy()
            program = extract_program(sch.mod)
            leaves = {k: torch.tensor([float(v)]) for k, v in program.values.items()}
            got = evaluate(program, leaves)[0].numpy()
            assert got.shape == ref.shape
            np.testing.assert_allclose(got, ref, atol=1e-9)
            checked += 1
    assert checked >= 8


def test_formulas_match_tvm_on_held_out_decisions(matmul_task):
    from gradtune.symbolic.verify import summary, verify_module

    mod, target, *_ = matmul_task
    reports = verify_module(mod, target, samples=4, seed=3)
    result = summary(reports, 4)
    assert result["sketches"] == 3 and result["features"] == 164
    assert result["exact_fraction"] > 0.97, result
    assert all(r.samples == 4 for r in reports)


@pytest.mark.parametrize("op", ["<<", ">>", "&", "|", "^", "~"])
def test_port_counts_bit_operations_as_the_cpp_extractor_does(op):
    """TVM 0.27's Python gives bit operations nodes of their own, while the C++ extractor
    counts each as a pure integer call and visits its operands."""
    import tvm
    from tvm import te
    from tvm.s_tir import meta_schedule as ms

    from gradtune.symbolic.features import evaluate
    from gradtune.symbolic.program import extract_program
    from gradtune.symbolic.verify import design_space

    a = te.placeholder((16, 32), name="A", dtype="int32")
    b = te.placeholder((16, 32), name="B", dtype="int32")
    apply = {
        "<<": lambda x, y: x << y,
        ">>": lambda x, y: x >> y,
        "&": lambda x, y: x & y,
        "|": lambda x, y: x | y,
        "^": lambda x, y: x ^ y,
        "~": lambda x, y: ~(x + y),
    }[op]
    c = te.compute((16, 32), lambda i, j: apply(a[i, j] * 3, b[i, j]), name="C")
    mod = tvm.IRModule({"main": te.create_prim_func([a, b, c])})
    ctx, *_ = design_space(mod, tvm.target.Target({"kind": "llvm", "num-cores": 2}), seed=0)
    sch = tvm.s_tir.Schedule(mod)
    args = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    ref = ms.feature_extractor.PerStoreFeature().extract_from(
        ctx, [ms.MeasureCandidate(sch, args)]
    )[0]
    program = extract_program(sch.mod)
    leaves = {k: torch.tensor([float(v)]) for k, v in program.values.items()}
    np.testing.assert_allclose(evaluate(program, leaves)[0].numpy(), ref.numpy(), atol=1e-9)


def test_formulas_are_exact_on_a_fast_math_epilogue():
    """The default lowering's fast sigmoid (``topi.fast_exp``) fused behind a matmul: its
    clamps, floor, casts and ``<< 23`` are all counted as TVM counts them."""
    import tvm
    from tvm import te, topi

    from gradtune.symbolic.verify import summary, verify_module

    a = te.placeholder((32, 48), name="A")
    b = te.placeholder((48, 64), name="B")
    k = te.reduce_axis((0, 48), name="k")
    c = te.compute((32, 64), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    e = topi.fast_exp(topi.negative(c))
    sig = te.compute((32, 64), lambda i, j: c[i, j] / (1.0 + e[i, j]), name="D")
    mod = tvm.IRModule({"main": te.create_prim_func([a, b, sig])})
    target = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    result = summary(verify_module(mod, target, samples=3, seed=1), 3)
    assert result["sketches"] == result["verified_sketches"] >= 1, result
    assert result["exact_fraction"] == 1.0, result


def test_formulas_are_exact_on_a_fast_softmax():
    """The default lowering's softmax (``topi.nn.fast_softmax``: max, ``fast_exp`` of the
    difference, sum, divide) over attention scores: every sketch is modelled exactly, so its
    kernel is searched by the descent rather than falling back to evolutionary search."""
    import tvm
    from tvm import te, topi

    from gradtune.symbolic.verify import summary, verify_module

    x = te.placeholder((1, 5, 24, 24), name="X")
    y = topi.nn.fast_softmax(x, axis=-1)
    mod = tvm.IRModule({"main": te.create_prim_func([x, y])})
    target = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    result = summary(verify_module(mod, target, samples=3, seed=1), 3)
    assert result["sketches"] == result["verified_sketches"] >= 1, result
    assert result["exact_fraction"] == 1.0, result


def test_verify_holds_its_samples_out_of_every_fit():
    """No sample is a probe of the sketch-wide fit, nor a neighbour any per-case fit used."""
    import tvm

    from gradtune.symbolic.sketch import SymbolicSketch
    from gradtune.symbolic.verify import design_space, load_tvmscript, verify_sketch

    mod = load_tvmscript(OPS / "dense_bias_relu.tvmscript")
    target = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    ctx, sketches, postprocs = design_space(mod, target, seed=0)
    rng = np.random.default_rng(0)
    sym = SymbolicSketch.build(mod, sketches[0].trace, postprocs, rng=rng, target=target)
    sketch_wide = set(sym.fitted_on)
    report = verify_sketch(sym, ctx, 4, rng)
    assert report.samples == 4 and report.held_out and report.verified
    assert len(sym.held_out) >= 2
    assert sym.fitted_on > sketch_wide  # the per-case fits' neighbours are in the check
    assert not sym.fitted_on & sym.held_out


def test_verify_checks_a_sketch_its_probes_exhaust_at_every_point():
    """A sketch whose only decision is an unroll step has four points, all probes: nothing can
    be held out, so it is checked at each of them, and the JSON says which sketch that was."""
    import tvm

    from gradtune.symbolic.sketch import SymbolicSketch
    from gradtune.symbolic.variables import SketchVariables
    from gradtune.symbolic.verify import design_space, load_tvmscript, summary, verify_sketch

    mod = load_tvmscript(OPS / "layer_norm.tvmscript")
    target = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    ctx, sketches, postprocs = design_space(mod, target, seed=0)
    rng = np.random.default_rng(0)
    index, sketch = next(
        (i, s) for i, s in enumerate(sketches) if not SketchVariables.from_trace(s.trace).tiles
    )
    sym = SymbolicSketch.build(mod, sketch.trace, postprocs, rng=rng, target=target)
    assert len(sym.variables.every_decision(100)) == len(sym.fitted_on) == 4
    report = verify_sketch(sym, ctx, 3, rng, index)
    assert report.exhaustive and not report.held_out and report.samples == 4
    assert report.verified
    result = summary([report], 3)
    assert result["exhaustive"] == [index] and "held_out" not in result


def test_per_case_fit_skips_held_out_neighbours(matmul_task):
    """The neighbours one per-case fit uses are, once held out, never fitted on by it."""
    from gradtune.symbolic.sketch import SymbolicSketch, decision_key

    mod, target, _, sketches, postprocs = matmul_task

    def built() -> SymbolicSketch:
        return SymbolicSketch.build(
            mod, sketches[0].trace, postprocs, rng=np.random.default_rng(4), target=target
        )

    first = built()
    point = first.replay(first.random_decisions(np.random.default_rng(9)))
    before = set(first.fitted_on)
    first.fit_case(point)
    used = first.fitted_on - before - {decision_key(point.decisions)}
    assert used

    second = built()
    assert second.fitted_on == before  # the same probes: the build is deterministic
    second.held_out = frozenset(used)
    second.fit_case(second.replay(point.decisions))
    assert not second.fitted_on & used


def test_smooth_features_have_finite_nonzero_gradients(matmul_task):
    from gradtune.symbolic.sketch import SymbolicSketch

    mod, _, _, sketches, postprocs = matmul_task
    rng = np.random.default_rng(5)
    sym = SymbolicSketch.build(mod, sketches[0].trace, postprocs, rng=rng)
    points = np.stack([sym.variables.random_point(rng) for _ in range(4)])
    x = torch.tensor(points, requires_grad=True)
    feats = sym.features(x, "smooth")
    assert any(f is not None for f in feats)
    total = sum(f.sum() for f in feats if f is not None) + sym.penalties(x).sum()
    total.backward()
    assert torch.isfinite(x.grad).all()
    for i, f in enumerate(feats):
        if f is not None:
            assert x.grad[i].abs().sum() > 0
    # Outside the region the penalty pushes back.
    outside = torch.full((1, sym.variables.dim), -2.0, dtype=torch.float64, requires_grad=True)
    sym.penalties(outside).sum().backward()
    assert (outside.grad < 0).any()


def test_points_applied_on_probe_threads_give_what_one_thread_gives(matmul_task, monkeypatch):
    """The descent's new points are applied on the probe threads: same programs, same
    features, same cache order, from a copy of one unscheduled schedule for every probe."""
    from gradtune.symbolic import sketch as sketch_module
    from gradtune.symbolic.sketch import SymbolicSketch

    mod, _, _, sketches, postprocs = matmul_task
    points = np.stack(
        [SymbolicSketch.build(mod, sketches[0].trace, postprocs).variables.random_point(rng)
         for rng in [np.random.default_rng(9)] for _ in range(12)]
    )  # fmt: skip

    def run(threaded: bool) -> tuple[list, list]:
        if not threaded:
            monkeypatch.setattr(sketch_module, "_probe_pool", lambda: None)
        sym = SymbolicSketch.build(mod, sketches[0].trace, postprocs, threaded=False)
        before = len(sym._cases)
        feats = sym.features(torch.tensor(points), "smooth", refit=False)
        monkeypatch.undo()
        return feats, [(k, repr(p.program) if p else None) for k, p in sym._cases.items()][before:]

    assert sketch_module._probe_pool() is not None  # CI's machine has two cores
    threaded, one = run(True), run(False)
    assert threaded[1] == one[1] and len(one[1]) >= 4  # new points, in the same order
    for a, b in zip(threaded[0], one[0], strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.equal(a, b)


def test_smooth_mode_is_close_to_exact_at_integer_points(matmul_task):
    from gradtune.symbolic.sketch import SymbolicSketch

    mod, _, _, sketches, postprocs = matmul_task
    rng = np.random.default_rng(7)
    sym = SymbolicSketch.build(mod, sketches[1].trace, postprocs, rng=rng)
    compared = 0
    for _ in range(6):
        decisions = sym.random_decisions(rng)
        exact = sym.features_at(decisions, "exact")
        if exact is None or torch.isnan(exact).any():
            continue
        x = torch.as_tensor(sym.variables.encode(decisions))[None]
        smooth = sym.features(x, "smooth")[0]
        # Smoothing rounds the clamps' corners by 5% of the operands: < 0.1 in log2 space.
        assert (smooth - exact).abs().max() < 0.1
        compared += 1
    assert compared >= 3


@pytest.mark.parametrize("name", ["dense_bias_relu", "softmax"])
def test_verify_cli_on_operator_files(name):
    result = run_cli("symbolic", "verify", str(OPS / f"{name}.tvmscript"), "--samples", "3")
    assert result.returncode == 0, result.stderr[-2000:]
    last = json.loads(result.stdout.strip().splitlines()[-1])
    assert last["sketches"] == last["verified_sketches"] >= 1
    assert last["features"] == 164 and last["samples"] == 3
    assert last["exact_fraction"] >= 0.99 and last["unsupported"] == []
    assert last["held_out"] is True


@pytest.mark.parametrize(
    "content, message",
    [
        ("this is not TVMScript at all (", "not TVMScript"),
        (
            "@I.ir_module\nclass Module:\n    @R.function\n"
            "    def main(x: R.Tensor((2,), dtype='float32')):\n        return x\n",
            "no PrimFunc",
        ),
    ],
)
def test_verify_rejects_bad_files(tmp_path, content, message):
    path = tmp_path / "task.py"
    path.write_text(content)
    result = run_cli("symbolic", "verify", str(path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gradtune: error:") and message in lines[0]


def test_verify_rejects_dynamic_shapes_and_unknown_targets(tmp_path):
    import tvm
    from tvm import te

    n = te.var("n", "int64")
    a = te.placeholder((n,), name="A")
    b = te.compute((n,), lambda i: a[i] + 1.0, name="B")
    dynamic = tmp_path / "dynamic.py"
    dynamic.write_text(tvm.IRModule({"main": te.create_prim_func([a, b])}).script())
    result = run_cli("symbolic", "verify", str(dynamic))
    assert result.returncode == 2 and "dynamic shapes" in result.stderr, result.stderr
    result = run_cli("symbolic", "verify", str(OPS / "softmax.tvmscript"), "--target", "vulkan")
    assert result.returncode == 2 and "vulkan" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
