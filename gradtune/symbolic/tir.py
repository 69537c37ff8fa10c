"""Generic reads of TIR expression nodes: the one place the symbolic layer walks TIR by itself.

``program.py`` (the feature collector), ``regions.py`` (index expressions) and ``gpu.py`` (the
``VerifyGPUCode`` port) all descend into expressions without caring what each node computes:
its children, the loop variables it reads, whether it loads from a buffer. They share these
helpers from here, below all three, so that none of them imports another for them.

Nodes are told apart by class name, not by ``isinstance``: TVM 0.27 builds some nodes under
names its Python classes do not have (a ``BufferLoad`` is a ``TensorLoad``), and this module
then needs no TVM import at all.
"""

from __future__ import annotations

from typing import Any

# Bit operations: nodes of their own in TVM 0.27's Python, but counted as pure calls
# (``int_math_func``) by the C++ feature extractor, children included. ``fast_exp`` builds
# its power of two with ``<< 23``, so every fast-math kernel holds one.
_BITWISE_BINARY = ("LShift", "RShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor")
BITWISE = (*_BITWISE_BINARY, "BitwiseNot")
# Expression nodes with two operands ``a`` and ``b``.
BINARY = (
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Mod",
    "FloorDiv",
    "FloorMod",
    "Max",
    "Min",
    "EQ",
    "NE",
    "LT",
    "LE",
    "GT",
    "GE",
    "And",
    "Or",
    *_BITWISE_BINARY,
)
# Buffer reads: TVM 0.27 prints and builds ``BufferLoad`` as ``TensorLoad``.
LOADS = ("BufferLoad", "TensorLoad")


def node_type(node: Any) -> str:
    """The node's class name, which is how the symbolic layer tells TIR nodes apart."""
    return type(node).__name__


def children(expr: Any) -> list[Any]:
    """The sub-expressions of an expression node ([] for leaves: variables, constants)."""
    t = node_type(expr)
    if t in BINARY:
        return [expr.a, expr.b]
    if t in ("Not", "BitwiseNot"):
        return [expr.a]
    if t == "Select":
        return [expr.condition, expr.true_value, expr.false_value]
    if t == "Call":
        return list(expr.args)
    if t in LOADS:
        return list(expr.indices)
    if t == "Cast":
        return [expr.value]
    if t == "Ramp":
        return [expr.base, expr.stride]
    if t == "Broadcast":
        return [expr.value]
    if t == "Let":
        return [expr.value, expr.body]
    if t == "Shuffle":
        return [*expr.vectors, *expr.indices]
    return []


def load_buffer(load: Any) -> Any:
    """The buffer a load reads (a ``TensorLoad`` names it ``source``)."""
    return load.buffer if hasattr(load, "buffer") else load.source


def has_load(expr: Any) -> bool:
    """Whether the expression reads any buffer."""
    if node_type(expr) in LOADS:
        return True
    return any(has_load(c) for c in children(expr))


def vars_in(expr: Any) -> list[Any]:
    """Every ``Var`` node of the expression, pre-order, repeats included."""
    out: list[Any] = []
    _collect_vars(expr, out)
    return out


def _collect_vars(expr: Any, out: list[Any]) -> None:
    if node_type(expr) == "Var":
        out.append(expr)
    for c in children(expr):
        _collect_vars(c, out)
