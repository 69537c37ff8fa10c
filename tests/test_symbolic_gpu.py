"""GPU constraints: our verdict agrees with TVM's VerifyGPUCode, the penalty pushes invalid
points back, and descending it finds points TVM accepts (a CUDA target; no GPU needed)."""

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


def test_gpu_constraints_agree_with_verify_gpu_code_and_guide_to_valid_points():
    from gradtune.symbolic.gpu import penalty, verdict
    from gradtune.symbolic.sketch import SymbolicSketch
    from gradtune.symbolic.verify import design_space, load_tvmscript
    from gradtune.target import make_target

    target = make_target(CUDA)
    mod = load_tvmscript(OPS / "dense_bias_relu.tvmscript")
    _, sketches, postprocs = design_space(mod, target)
    rng = np.random.default_rng(0)
    sym = SymbolicSketch.build(mod, sketches[0].trace, postprocs, True, rng=rng, target=target)
    agree = total = valid = 0
    for _ in range(25):
        probe = sym.replay(sym.variables.round(sym.variables.random_point(rng)))
        if probe is None:
            continue
        total += 1
        agree += verdict(probe.program, target)[0] == probe.valid
    for _ in range(5):
        probe = sym.replay(sym.random_decisions(rng))  # seeds pulled into the region
        if probe is not None:
            total += 1
            valid += probe.valid
            agree += verdict(probe.program, target)[0] == probe.valid
    assert total >= 20 and agree == total
    assert valid >= 3, "descending the penalties should reach points TVM accepts"

    # An invalid point's penalty has a finite, non-zero gradient.
    for _ in range(50):
        x = torch.tensor(sym.variables.random_point(rng)[None], requires_grad=True)
        probe = sym.replay(sym.variables.round(x[0].detach().numpy()))
        if probe is not None and not probe.valid:
            break
    log_f, cats = sym.continuous_columns(x)
    leaves = sym.leaves(probe.program, log_f, cats, point_values=True)
    value = penalty(probe.program, leaves, target)
    value.sum().backward()
    assert float(value) > 0 and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
