"""Blocked-channel convolutions: NCHW[x]c data, OIHW[x]i[x]o weights, x a vector register's lanes.

A 2-D convolution in NCHW vectorizes over output columns: at stride 2 its input loads are
strided, and late in a network a row is shorter than a register. The blocked layout splits the
channels into chunks of one register's lanes and keeps each chunk innermost in the data, the
weights and the output: a vector loads and stores whole registers of output channels and reads
contiguous weights, whatever the stride or the row's length. This
is the layout TVM's x86 convolutions were scheduled in (Relay's ``AlterOpLayout`` to
``conv2d_NCHWc``), and ONNX Runtime's MLAS runs convolutions NCHWc too (its ``NchwcTransformer``).

Relax's ``ConvertLayout`` rewrites each convolution whose channel counts divide by the block, and
carries the layout through the element-wise operators and pools that follow it, so a chain of
convolutions converts its activations only where it meets an operator with no blocked layout
(a flatten, a matmul); the weights' transforms are constants, folded at compile time. Relax
cannot legalize a blocked convolution on its own: ``legalize_conv2d`` does.

Off by default (``Lowering.conv_layout``): at 64 trials per kernel the blocked space gave faster
programs in some runs and slower ones in others, slower by the median.
"""

from __future__ import annotations

from typing import Any


def layouts(lanes: int) -> tuple[str, str]:
    """The data and weight layouts of a blocked convolution of ``lanes`` channels per chunk."""
    return f"NCHW{lanes}c", f"OIHW{lanes}i{lanes}o"


def blocked_conv2d(data: Any, kernel: Any, strides: Any, padding: Any, dilation: Any,
                   out_dtype: str) -> Any:  # fmt: skip
    """A blocked convolution (one group) whose reduction over input channels is two loops,
    chunk and lane, as the data and the weights store them. ``topi.nn.conv2d_NCHWc`` reduces
    over one channel loop and indexes both by its quotient and remainder by the block: a
    tile of it is no whole chunk unless the search happens to split by the block. On
    resnet18_like's three largest convolutions (Zen 3, 64 evolutionary trials each, 3 repeats)
    TOPI's came out 0.76× of NCHW per kernel, this one 0.84×, though its fastest program of each
    beat every NCHW one (``bench/results/lowering_nchwc_znver3.md``)."""
    from tvm import te, topi
    from tvm.topi.nn.utils import get_pad_tuple

    n, ic_chunk, height, width, ic_block = (int(d) for d in data.shape)
    oc_chunk, _, kh, kw, _, oc_block = (int(d) for d in kernel.shape)
    sh, sw = (int(s) for s in strides)
    dh, dw = (int(d) for d in dilation)
    top, left, bottom, right = get_pad_tuple(padding, ((kh - 1) * dh + 1, (kw - 1) * dw + 1))
    if top or left or bottom or right:
        data = topi.nn.pad(data, (0, 0, top, left, 0), (0, 0, bottom, right, 0), name="data_pad")
    out_h = (height + top + bottom - (kh - 1) * dh - 1) // sh + 1
    out_w = (width + left + right - (kw - 1) * dw - 1) // sw + 1
    icc = te.reduce_axis((0, ic_chunk), name="icc")
    icb = te.reduce_axis((0, ic_block), name="icb")
    rh = te.reduce_axis((0, kh), name="rh")
    rw = te.reduce_axis((0, kw), name="rw")
    return te.compute(
        (n, oc_chunk, out_h, out_w, oc_block),
        lambda b, occ, y, x, ocb: te.sum(
            data[b, icc, y * sh + rh * dh, x * sw + rw * dw, icb].astype(out_dtype)
            * kernel[occ, icc, rh, rw, icb, ocb].astype(out_dtype),
            axis=[icc, rh, rw, icb],
        ),
        name="conv2d_NCHWc",
    )


def legalize_conv2d(bb: Any, call: Any) -> Any:
    """Legalize ``relax.nn.conv2d``: a blocked one of one group as ``blocked_conv2d``, a
    blocked grouped one as ``topi.nn.conv2d_NCHWc``, any other as Relax does."""
    from tvm import topi
    from tvm.relax.transform.legalize_ops.nn import _nn_conv2d

    attrs = call.attrs
    if len(attrs.data_layout) == 4:
        return _nn_conv2d(bb, call)
    dtype = attrs.out_dtype or call.args[0].struct_info.dtype
    if attrs.groups == 1:
        return bb.call_te(
            blocked_conv2d, call.args[0], call.args[1], attrs.strides, attrs.padding,
            attrs.dilation, dtype, primfunc_name_hint="conv2d_NCHWc",
        )  # fmt: skip
    return bb.call_te(
        topi.nn.conv2d_NCHWc, call.args[0], call.args[1], attrs.strides, attrs.padding,
        attrs.dilation, attrs.data_layout, attrs.out_layout, dtype,
        primfunc_name_hint="conv2d_NCHWc",
    )  # fmt: skip
