"""Transposed convolutions as one dense convolution per output phase (sub-pixel convolution).

TOPI lowers a 2-D transposed convolution of stride s by spreading its input over a grid s times
finer, filling the gaps with zeros, padding it by K - 1 - p and running a dense convolution over
the result. At s = 2 three of every four multiply-adds are by those zeros, and at a 1×1 input
(a generator's first layer) the padding makes 15 of 16 of them zeros. No schedule can skip
them: MetaSchedule only reorders and tiles the loops of the computation it is given. ONNX
Runtime computes the same operator as a GEMM and a col2im, with no zeros.

Output row ``o`` of a transposed convolution only ever meets the kernel rows ``k`` with
``k ≡ o + p (mod s)``. So the output splits into s × s phases, and each phase is a dense
convolution of the input with a sub-kernel of ceil(K / s) × ceil(K / s) taps. ``legalize``
computes all of them as one ordinary convolution whose output channels are (channel, row
phase, column phase). A last stage then interleaves the phases into the output rows and
columns. That stage is a gather that the epilogue (BatchNorm, ReLU) is fused after, in the same
kernel. What the search tunes is a plain convolution, a shape MetaSchedule's design space and
gradtune's cost model know well. Its only waste is the few border rows the phases share:
at 4 × 4 → 8 × 8 (K = 4, s = 2, p = 1), 1.56× the useful multiply-adds instead of 4×. An
input of one pixel meets every kernel tap exactly once whatever the stride, so it is taken as
stride K: one phase per tap and no zeros at all, a matrix product.

The sub-kernels are rearranged from the weights at lowering time, so this applies where the
weights are constants (gradtune binds them before lowering). Other layouts, groups and weights
that are inputs keep Relax's own lowering.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Phases:
    """One spatial axis of a transposed convolution, cut into phases.

    ``stride`` is the phase count (the operator's stride, or K for a one-pixel input), ``taps``
    each phase's sub-kernel length, ``first`` the first phase row computed (phase rows before
    it fall in the cropped padding), ``rows`` how many phase rows are computed and ``offset``
    where output row 0 falls in the rows of the interleaved phases.
    """

    stride: int
    taps: int
    first: int
    rows: int
    offset: int

    @classmethod
    def of(cls, size: int, kernel: int, stride: int, pad_before: int, out: int) -> Phases:
        if size == 1:
            stride = kernel  # a one-pixel input meets each tap once, whatever the stride
        taps = math.ceil(kernel / stride)
        first = pad_before // stride
        last = (pad_before + out - 1) // stride
        return cls(stride, taps, first, last - first + 1, pad_before - first * stride)

    def input_shift(self) -> int:
        """Phase row q reads input rows q - taps + 1 .. q: the input is shifted by this much
        (positive: zeros before it; negative: rows dropped)."""
        return self.taps - 1 - self.first


def output_size(size: int, kernel: int, stride: int, pad: tuple[int, int], extra: int) -> int:
    return (size - 1) * stride + kernel - pad[0] - pad[1] + extra


def sub_kernels(weight: np.ndarray, rows: Phases, cols: Phases) -> np.ndarray:
    """IOHW weights → the OIHW weights of the phase convolution: output channel
    ``(c * rows.stride + r) * cols.stride + q`` is channel c's sub-kernel of phase (r, q),
    flipped (tap t meets input row ``phase row - taps + 1 + t``); taps past K are zeros."""
    cin, cout, kh, kw = weight.shape
    out = np.zeros((cout, rows.stride, cols.stride, cin, rows.taps, cols.taps), dtype=weight.dtype)
    for r in range(rows.stride):
        for th in range(rows.taps):
            k_h = r + (rows.taps - 1 - th) * rows.stride
            if k_h >= kh:
                continue
            for q in range(cols.stride):
                for tw in range(cols.taps):
                    k_w = q + (cols.taps - 1 - tw) * cols.stride
                    if k_w < kw:
                        out[:, r, q, :, th, tw] = weight[:, :, k_h, k_w].T
    return out.reshape(cout * rows.stride * cols.stride, cin, rows.taps, cols.taps)


def applies(call: Any) -> bool:
    """Whether ``legalize`` rewrites this ``relax.nn.conv2d_transpose``."""
    from tvm.ir.expr import Constant

    attrs = call.attrs
    data, weight = call.args
    return (
        attrs.data_layout == "NCHW"
        and attrs.kernel_layout == "IOHW"
        and attrs.out_layout == "NCHW"
        and int(attrs.groups) == 1
        and isinstance(weight, Constant)
        and all(isinstance(d, int) or hasattr(d, "value") for d in data.ty.shape)
    )


def legalize(bb: Any, call: Any) -> Any:
    """Legalize ``relax.nn.conv2d_transpose`` as a phase convolution (module docstring), or as
    Relax does where that does not apply."""
    from tvm import relax, te, topi
    from tvm.relax.transform.legalize_ops.nn import _nn_conv2d_transpose

    if not applies(call):
        return _nn_conv2d_transpose(bb, call)
    attrs = call.attrs
    data, weight_const = call.args
    weight = weight_const.value.numpy()
    dil_h, dil_w = (int(d) for d in attrs.dilation)
    if dil_h > 1 or dil_w > 1:
        # A dilated kernel is the kernel with zeros between its taps; the phases drop them.
        cin, cout, kh, kw = weight.shape
        dilated = np.zeros((cin, cout, (kh - 1) * dil_h + 1, (kw - 1) * dil_w + 1), weight.dtype)
        dilated[:, :, ::dil_h, ::dil_w] = weight
        weight = dilated
    n, cin, height, width = (int(d) for d in data.ty.shape)
    _, cout, kh, kw = weight.shape
    sh, sw = (int(s) for s in attrs.strides)
    top, left, bottom, right = (int(p) for p in attrs.padding)
    extra_h, extra_w = (int(p) for p in attrs.output_padding)
    out_h = output_size(height, kh, sh, (top, bottom), extra_h)
    out_w = output_size(width, kw, sw, (left, right), extra_w)
    rows = Phases.of(height, kh, sh, top, out_h)
    cols = Phases.of(width, kw, sw, left, out_w)
    kernel = relax.const(sub_kernels(weight, rows, cols))
    dtype = attrs.out_dtype or call.ty.dtype

    def compute(x: Any, w: Any) -> Any:
        shift_h, shift_w = rows.input_shift(), cols.input_shift()
        padded_h, padded_w = rows.rows + rows.taps - 1, cols.rows + cols.taps - 1

        def shifted(b: Any, c: Any, i: Any, j: Any) -> Any:
            y, z = i - shift_h, j - shift_w
            inside = te.all(y >= 0, y < height, z >= 0, z < width)
            return te.if_then_else(inside, x[b, c, y, z], te.const(0, x.dtype))

        pad = te.compute((n, cin, padded_h, padded_w), shifted, name="data_pad")
        phases = topi.nn.conv2d_nchw(pad, w, 1, 0, 1, out_dtype=dtype)
        per_row, per_col = rows.stride, cols.stride

        def interleave(b: Any, c: Any, i: Any, j: Any) -> Any:
            y, z = i + rows.offset, j + cols.offset
            channel = (c * per_row + y % per_row) * per_col + z % per_col
            return phases[b, channel, y // per_row, z // per_col]

        return te.compute((n, cout, out_h, out_w), interleave, name="interleave_phases")

    return bb.call_te(compute, data, kernel, primfunc_name_hint="conv2d_transpose")
