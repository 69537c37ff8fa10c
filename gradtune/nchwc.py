"""Blocked-channel convolutions: NCHW[x]c data, OIHW[x]i[x]o weights, x a vector register's lanes.

A 2-D convolution in NCHW vectorizes over output columns: at stride 2 its input loads are
strided, and late in a network a row is shorter than a register. NHWC vectorizes over output
channels but keeps the whole channel axis innermost, so a tile of it is a slice of a long row.
The blocked layout splits the channels into chunks of one register's lanes and keeps each chunk
innermost in the data, the weights and the output: a vector loads and stores whole registers of
output channels, its weights are contiguous, and a tile of the rest is a plain loop nest. This
is the layout TVM's x86 convolutions were scheduled in (Relay's ``AlterOpLayout`` to
``conv2d_NCHWc``), and ONNX Runtime's MLAS runs convolutions NCHWc too (its ``NchwcTransformer``).

Relax's ``ConvertLayout`` rewrites each convolution whose channel counts divide by the block, and
carries the layout through the element-wise operators and pools that follow it, so a chain of
convolutions converts its activations only where it meets an operator with no blocked layout
(a flatten, a matmul); the weights' transforms are constants, folded at compile time. Relax
cannot legalize a blocked convolution to TOPI on its own: ``legalize_conv2d`` does, with
``topi.nn.conv2d_NCHWc``.
"""

from __future__ import annotations

from typing import Any


def layouts(lanes: int) -> tuple[str, str]:
    """The data and weight layouts of a blocked convolution of ``lanes`` channels per chunk."""
    return f"NCHW{lanes}c", f"OIHW{lanes}i{lanes}o"


def legalize_conv2d(bb: Any, call: Any) -> Any:
    """Legalize ``relax.nn.conv2d``: a blocked one as ``topi.nn.conv2d_NCHWc``, any other as
    Relax does."""
    from tvm import topi
    from tvm.relax.transform.legalize_ops.nn import _nn_conv2d

    attrs = call.attrs
    if len(attrs.data_layout) == 4:
        return _nn_conv2d(bb, call)
    dtype = attrs.out_dtype or call.args[0].struct_info.dtype
    return bb.call_te(
        topi.nn.conv2d_NCHWc, call.args[0], call.args[1], attrs.strides, attrs.padding,
        attrs.dilation, attrs.data_layout, attrs.out_layout, dtype,
        primfunc_name_hint="conv2d_NCHWc",
    )  # fmt: skip
