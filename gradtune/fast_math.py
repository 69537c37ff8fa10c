"""Vectorizable approximations of the transcendental functions fused into kernels' epilogues.

TVM lowers ``relax.sigmoid`` (and with it SiLU, ``x * sigmoid(x)``) to ``tir.sigmoid``, which
LLVM turns into one scalar ``expf`` call per element: no schedule can vectorize it, so a
convolution with a SiLU epilogue costs its output size times the libm call whatever the search
finds. On an AMD EPYC (znver5) ``x * sigmoid(x)`` over 41,472 floats took 80 µs untuned, and
``x / (1 + fast_exp(-x))`` 12 µs. In mbconv_se (bench/models) a 1×1 convolution, 24 → 72
channels, with BN and SiLU stayed at its default schedule, ~240 µs, through 480 s of either
searcher. With the approximation, 48 evolutionary trials brought it to 54 µs. ONNX Runtime's
MLAS computes the logistic function by a polynomial approximation too.

``topi.fast_exp`` is a range reduction to 2^n times a polynomial: branch-free floating-point
arithmetic, vectorized like any other epilogue, with a relative error around 1e-7 in float32.
``erf`` (exact GELU) and ``tanh`` are libm calls too: bert_block's FFN kernel, a matmul with a
GELU epilogue (``erf``), is its largest; ``topi.fast_erf`` and ``topi.fast_tanh`` are clamped
rational polynomials (Eigen's), branch-free as well.

Softmax exponentiates every element of its rows: on bert_block's attention scores (5 heads of
24 × 24) the exact softmax stayed at its default schedule, ~13 µs, through 480 s of either
searcher, a fifth of the model's estimated time, while 3 to 6 of its ~27 rounds went to it.
``topi.nn.fast_softmax`` is the same max / exp / sum / divide with ``fast_exp``: 64
evolutionary trials took that kernel to 7.1 µs against 13.0 exact (medians of 3,
``bench/results/lowering_softmax.md``). TVM's Relay ``FastMath`` pass made the same four
substitutions (exp, softmax, erf, tanh).
"""

from __future__ import annotations

from typing import Any


def fast_sigmoid(bb: Any, call: Any) -> Any:
    """Legalize ``relax.sigmoid(x)`` as ``1 / (1 + fast_exp(-x))``."""
    from tvm import topi

    def compute(x: Any) -> Any:
        return topi.divide(1.0, topi.add(1.0, topi.fast_exp(topi.negative(x))))

    return bb.call_te(compute, call.args[0], primfunc_name_hint="fast_sigmoid")


def fast_erf(bb: Any, call: Any) -> Any:
    """Legalize ``relax.erf(x)`` (exact GELU as ONNX spells it) as ``fast_erf(x)``."""
    from tvm import topi

    return bb.call_te(topi.fast_erf, call.args[0], primfunc_name_hint="fast_erf")


def fast_gelu(bb: Any, call: Any) -> Any:
    """Legalize ``relax.nn.gelu(x)`` (exact GELU as PyTorch spells it) as
    ``x · (0.5 + 0.5 · fast_erf(x / √2))``."""
    from tvm import topi

    def compute(x: Any) -> Any:
        erf = topi.fast_erf(topi.multiply(x, 0.7071067811865476))
        return topi.multiply(x, topi.add(0.5, topi.multiply(erf, 0.5)))

    return bb.call_te(compute, call.args[0], primfunc_name_hint="fast_gelu")


def fast_tanh(bb: Any, call: Any) -> Any:
    """Legalize ``relax.tanh(x)`` as ``fast_tanh(x)``."""
    from tvm import topi

    return bb.call_te(topi.fast_tanh, call.args[0], primfunc_name_hint="fast_tanh")


def fast_exp(bb: Any, call: Any) -> Any:
    """Legalize ``relax.exp(x)`` as ``fast_exp(x)``."""
    from tvm import topi

    return bb.call_te(topi.fast_exp, call.args[0], primfunc_name_hint="fast_exp")


def fast_softmax(bb: Any, call: Any) -> Any:
    """Legalize ``relax.nn.softmax(x, axis)`` as ``topi.nn.fast_softmax``: the row's maximum
    subtracted first, as in the exact one, so ``fast_exp`` only ever sees x ≤ 0."""
    from tvm import topi

    return bb.call_te(
        topi.nn.fast_softmax, call.args[0], call.attrs.axis, primfunc_name_hint="fast_softmax"
    )


# topi's fast_* approximate float32 (fast_erf float16 too) and fall back to the exact
# function for other dtypes, so a float64 model keeps libm.
APPROXIMATIONS = {
    "relax.sigmoid": fast_sigmoid,
    "relax.erf": fast_erf,
    "relax.nn.gelu": fast_gelu,
    "relax.tanh": fast_tanh,
    "relax.exp": fast_exp,
    "relax.nn.softmax": fast_softmax,
}
