"""GPU constraints on a CUDA target (no GPU needed): our exact verdict agrees with TVM's
VerifyGPUCode postproc on sampled decisions, the penalty has finite non-zero gradients where
violated, and descending it reaches points TVM accepts."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

OPS = Path(__file__).parent / "ops"
CUDA = {
    "kind": "cuda",
    "arch": "sm_80",
    "max_shared_memory_per_block": 49152,
    "max_threads_per_block": 1024,
    "thread_warp_size": 32,
    "registers_per_block": 65536,
}

pytestmark = pytest.mark.slow  # the CUDA tensor intrinsics take ~45 s to import


def _sample(var, rng, bias: bool):
    """Decisions like MetaSchedule's SamplePerfectTile (each prime to a random factor); with
    ``bias``, 5-level spatial tiles favour their thread level so many points are valid."""
    from gradtune.symbolic.variables import TileVar

    decisions = {}
    for v in var.variables:
        if isinstance(v, TileVar):
            factors = [1] * v.n
            for p, e in zip(v.primes, v.totals, strict=True):
                for _ in range(e):
                    at = 2 if bias and v.n == 5 and rng.random() < 0.5 else rng.integers(v.n)
                    factors[at] *= p
            decisions[v.index] = factors
        else:
            decisions[v.index] = int(rng.integers(len(v.candidates)))
    # Through encode/round: enforces max_innermost_factor as decode does.
    return var.round(var.encode(decisions))


@pytest.fixture(scope="module")
def cuda_task():
    from gradtune.symbolic.verify import design_space, load_tvmscript
    from gradtune.target import make_target

    target = make_target(CUDA)
    # conv2d NCHW stride 2: its sketches reject by thread range, shared memory (tripled by
    # software pipelining) and pipelining of an extent-1 loop — every kind we model.
    mod = load_tvmscript(OPS / "conv2d_nchw_s2.tvmscript")
    return (mod, target, *design_space(mod, target))


def test_verdict_agrees_with_verify_gpu_code(cuda_task):
    from gradtune.symbolic.gpu import gpu_verdict, tvm_gpu_errors
    from gradtune.symbolic.program import extract_program
    from gradtune.symbolic.variables import SketchVariables

    mod, target, _, sketches, postprocs = cuda_task
    checks = [p for p in postprocs if type(p).__name__ == "VerifyGPUCode"]
    rewrites = [p for p in postprocs if p not in checks]
    assert len(checks) == 1
    rng = np.random.default_rng(0)
    points = agree = port_agree = valid = 0
    reasons: set[str] = set()
    for sketch in sketches:
        var = SketchVariables.from_trace(sketch.trace)
        for j in range(24):
            decisions = _sample(var, rng, bias=j % 3 != 0)
            sch, _ = var.decode(mod, var.encode(decisions), rewrites)
            if sch is None:
                continue
            tvm_ok = bool(checks[0].apply(sch))
            ours, violated = gpu_verdict(extract_program(sch.mod, is_gpu=True), target)
            errors = tvm_gpu_errors(sch.mod, target)
            points += 1
            valid += tvm_ok
            agree += ours == tvm_ok
            port_agree += (not errors) == tvm_ok
            reasons.update(name.split("_")[0] for name in violated)
    assert points >= 60
    assert agree == points, f"verdict agrees on {agree}/{points}"
    assert port_agree == points
    # Both verdicts occur, and more than one kind of violation: the agreement is not trivial.
    assert 5 <= valid <= points - 5
    assert {"thread", "shared"} <= reasons, reasons


def test_uninitialized_verify_gpu_code_rejects_everything(cuda_task):
    """Why a probe once saw every point rejected: a VerifyGPUCode never initialized with a
    TuneContext has warp size −1; its checker's ICHECK throws inside a try → "invalid"."""
    from tvm.s_tir import meta_schedule as ms

    from gradtune.symbolic.gpu import tvm_gpu_errors
    from gradtune.symbolic.variables import SketchVariables

    mod, target, _, sketches, postprocs = cuda_task
    rewrites = [p for p in postprocs if type(p).__name__ != "VerifyGPUCode"]
    var = SketchVariables.from_trace(sketches[0].trace)
    rng = np.random.default_rng(1)
    for _ in range(50):
        sch, _ = var.decode(mod, var.encode(_sample(var, rng, bias=True)), rewrites)
        if sch is not None and not tvm_gpu_errors(sch.mod, target):
            break
    else:
        pytest.fail("no valid point found")
    initialized = next(p for p in postprocs if type(p).__name__ == "VerifyGPUCode")
    assert initialized.apply(sch)
    assert not ms.postproc.VerifyGPUCode().apply(sch)


def test_penalty_gradient_and_descent_to_valid_points(cuda_task):
    from gradtune.symbolic.gpu import gpu_penalties, gpu_verdict
    from gradtune.symbolic.sketch import SymbolicSketch

    mod, target, _, sketches, postprocs = cuda_task
    rng = np.random.default_rng(2)
    sym = SymbolicSketch.build(mod, sketches[0].trace, postprocs, True, rng=rng, target=target)
    checked = 0
    for _ in range(60):
        x = torch.tensor(sym.variables.random_point(rng)[None], requires_grad=True)
        probe = sym.replay(sym.variables.round(x[0].detach().numpy()))
        if probe is None:
            continue
        log_f, cats = sym.continuous_columns(x)
        leaves = sym.leaves(probe.program, log_f, cats, point_values=True)
        value = gpu_penalties(probe.program, leaves, target)
        ours = gpu_verdict(probe.program, target)[0]
        assert ours == probe.valid
        if ours:
            continue
        value.sum().backward()
        # Violated: positive penalty, finite and non-zero gradient.
        assert float(value.detach()) > 0 and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
        checked += 1
        if checked >= 3:
            break
    assert checked >= 3
    reached = 0
    for _ in range(5):
        probe = sym.replay(sym.random_decisions(rng))  # seeds pulled into the region
        reached += probe is not None and probe.valid
    assert reached >= 3, "descending the penalties should reach points TVM accepts"


def test_verify_cli_with_a_bare_cuda_target(capsys):
    """``--target cuda`` names no device limits; MetaSchedule's GPU rules need them
    (target.CUDA_DEFAULTS), and the verification runs without a GPU."""
    # In this process: a new one would import the CUDA tensor intrinsics again (~45 s).
    from gradtune.cli import main

    args = ["symbolic", "verify", str(OPS / "softmax.tvmscript"), "--target", "cuda"]
    code = main([*args, "--samples", "2"])
    out, err = capsys.readouterr()
    # Every sketch of CUDA softmax verifies, its cross-thread reductions included.
    assert code == 0, err[-2000:]
    last = json.loads(out.strip().splitlines()[-1])
    assert last["sketches"] == last["verified_sketches"] >= 1 and last["samples"] == 2
    assert last["gpu_verdict_agreement"] == 1.0


def test_ceiling_division_extents_are_derived_and_verify(cuda_task):
    """CUDA max pooling fuses its output loops and splits them by a sampled thread count that
    need not divide them: blockIdx.x = ⌈6272 / T⌉, no closed form of the decision. The
    extent is derived (``regions.Quotient``), every sketch verifies against TVM, and the
    compiled features and their gradients equal ``evaluate``'s there."""
    from gradtune.symbolic.regions import Quotient
    from gradtune.symbolic.sketch import SymbolicSketch
    from gradtune.symbolic.verify import design_space, load_tvmscript, summary, verify_module
    from tests.test_symbolic_compiled import compare, mixed_points

    target = cuda_task[1]
    mod = load_tvmscript(OPS / "max_pool2d.tvmscript")
    result = summary(verify_module(mod, target, samples=6, seed=0), 6)
    assert result["verified_sketches"] == result["sketches"] >= 2, result["unsupported"]

    _, sketches, postprocs = design_space(mod, target, seed=0)
    rng = np.random.default_rng(0)
    sym = SymbolicSketch.build(mod, sketches[0].trace, postprocs, True, rng, target=target)
    threads = next(v for v in sym.variables.categoricals if v.candidates[0] == 32)  # not unroll
    decisions = {**sym.variables.sketch_decisions(), threads.index: threads.candidates.index(1024)}
    program = sym.replay(decisions).program
    quotients = {k: q for k, q in program.derived.items() if isinstance(q, Quotient)}
    assert any(program.values[k] == 7 for k in quotients)  # ⌈6272 / 1024⌉
    for mode in ("exact", "smooth"):
        compare(sym, mixed_points(sym, rng, spread=3), mode)
