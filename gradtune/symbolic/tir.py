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
BINARY = frozenset(
    (
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
)
# Buffer reads: TVM 0.27 prints and builds ``BufferLoad`` as ``TensorLoad``.
LOADS = frozenset(("BufferLoad", "TensorLoad"))


def node_type(node: Any) -> str:
    """The node's class name, which is how the symbolic layer tells TIR nodes apart."""
    return type(node).__name__


# One lookup per node: ``children`` runs millions of times per tuning round (every rounded
# point of the descent is a program to walk), and a chain of name comparisons was most of it.
_CHILDREN: dict[str, Any] = {
    **{t: lambda e: [e.a, e.b] for t in BINARY},
    "Not": lambda e: [e.a],
    "BitwiseNot": lambda e: [e.a],
    "Select": lambda e: [e.condition, e.true_value, e.false_value],
    "Call": lambda e: list(e.args),
    **{t: lambda e: list(e.indices) for t in LOADS},
    "Cast": lambda e: [e.value],
    "Ramp": lambda e: [e.base, e.stride],
    "Broadcast": lambda e: [e.value],
    "Let": lambda e: [e.value, e.body],
    "Shuffle": lambda e: [*e.vectors, *e.indices],
}


def children(expr: Any) -> list[Any]:
    """The sub-expressions of an expression node ([] for leaves: variables, constants)."""
    get = _CHILDREN.get(type(expr).__name__)
    return [] if get is None else get(expr)


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
