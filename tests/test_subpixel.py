"""The phase (sub-pixel) lowering of transposed convolutions: the same outputs as TOPI's, with
the zeros TOPI multiplies by left out."""

from __future__ import annotations

import numpy as np
import pytest

from gradtune import subpixel

# (in channels, out channels, height, width, kernel, stride, padding, output padding, dilation)
CASES = [
    (32, 64, 1, 1, (4, 4), 1, 0, 0, 1),  # a generator's first layer: one input pixel
    (64, 32, 4, 4, (4, 4), 2, 1, 0, 1),  # DCGAN's upsampling layers
    (8, 5, 5, 7, (3, 3), 2, 1, (1, 1), 1),  # kernel not a multiple of the stride
    (4, 6, 6, 5, (5, 3), (3, 2), (2, 1, 0, 2), (2, 1), 1),  # every attribute unequal
    (3, 4, 4, 4, (3, 3), 1, 1, 0, 1),  # stride 1: a flipped kernel, one phase
    (3, 4, 4, 4, (3, 3), 2, 0, 0, (2, 2)),  # dilated: the kernel's zeros dropped too
    (5, 2, 1, 1, (3, 3), 2, 1, 0, 1),  # one pixel in, one pixel out
    (2, 3, 3, 3, (4, 4), 2, 3, 1, 1),  # padding past a phase: leading phase rows dropped
]


def _run(case, legalize_map):
    import tvm
    from tvm import relax

    cin, cout, height, width, kernel, stride, padding, extra, dilation = case
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((cin, cout, *kernel)).astype("float32")
    data = rng.standard_normal((1, cin, height, width)).astype("float32")
    x = relax.Var("x", relax.TensorType((1, cin, height, width), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        y = bb.emit(relax.op.nn.conv2d_transpose(
            x, relax.const(weight), strides=stride, padding=padding, output_padding=extra,
            dilation=dilation))  # fmt: skip
        bb.emit_func_output(y)
    mod = relax.transform.LegalizeOps(customize_legalize_map=legalize_map)(bb.get())
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(data)).numpy(), mod


@pytest.mark.parametrize("case", CASES, ids=[str(c[:7]) for c in CASES])
def test_phase_lowering_computes_what_topi_computes(case):
    phases, mod = _run(case, {"relax.nn.conv2d_transpose": subpixel.legalize})
    topi, _ = _run(case, None)
    assert phases.shape == topi.shape
    np.testing.assert_allclose(phases, topi, rtol=1e-5, atol=1e-5)
    # Its kernel convolves the phases: TOPI's zero-spreading stage is gone.
    script = mod.script()
    assert "interleave_phases" in script and "data_dilate" not in script


def test_a_weight_that_is_an_input_keeps_topis_lowering():
    """The sub-kernels are cut from the weights at lowering time: an input weight cannot be."""
    import tvm
    from tvm import relax

    x = relax.Var("x", relax.TensorType((1, 4, 3, 3), "float32"))
    w = relax.Var("w", relax.TensorType((4, 2, 4, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        bb.emit_func_output(bb.emit(relax.op.nn.conv2d_transpose(x, w, strides=2, padding=1)))
    mod = relax.transform.LegalizeOps(
        customize_legalize_map={"relax.nn.conv2d_transpose": subpixel.legalize}
    )(bb.get())
    script = mod.script()
    assert "data_dilate" in script and "interleave_phases" not in script
    assert isinstance(mod, tvm.IRModule)


def test_dcgan_tasks_keep_their_fusion_and_lose_the_zeros(llvm_target):
    """On dcgan_like every transposed convolution keeps its BatchNorm and ReLU in one kernel (the
    tasks keep their names), computes 2.5-15× fewer FLOPs, and the model still matches PyTorch."""
    from gradtune import compilation
    from gradtune.frontend import load_model
    from gradtune.partition import Lowering, extract, prepare
    from tests.conftest import EXAMPLES

    model = load_model(EXAMPLES / "dcgan_like.py")
    tasks, fused = {}, {}
    for on in (False, True):
        fused[on] = prepare(model.mod, model.params, llvm_target,
                            Lowering(subpixel_conv_transpose=on))  # fmt: skip
        tasks[on] = {t.name: t.flops for t in extract(fused[on], llvm_target)}
    assert tasks[True].keys() == tasks[False].keys() and len(tasks[True]) == 4
    for name, flops in tasks[True].items():
        assert 2.5 * flops < tasks[False][name], (name, flops, tasks[False][name])
    executable = compilation.build(fused[True], llvm_target)
    runner = compilation.Runner(executable, llvm_target, model.inputs)
    assert compilation.verify(runner.outputs(), model.reference_outputs, "phases") < 1e-4


def test_phases_of_one_pixel_are_its_taps():
    """A one-pixel input meets each kernel tap once: one phase per tap, one tap per phase."""
    rows = subpixel.Phases.of(size=1, kernel=4, stride=2, pad_before=0, out=4)
    assert (rows.stride, rows.taps, rows.rows, rows.offset) == (4, 1, 1, 0)
    assert subpixel.output_size(1, 4, 2, (0, 0), 0) == 4
