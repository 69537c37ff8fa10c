"""Region extents derived from index expressions, with the interval rules TVM applies to them.

``PerStoreFeature`` sizes the region a loop nest touches per buffer dimension with
``const_int_bound`` of the index expression: every loop is first bound to its minimum, then
loops are opened (bound to their range) from the innermost outwards. Fitting those extents as
closed forms of the decisions fails where they are not monomials, and they often are not:

- a halo (``oh * 2 + kh``) is a *sum* of tile-dependent terms, ``2 (E_oh − 1) + E_kh``;
- a fused loop's ``fused // J`` is a *floor*, ``⌊(E − 1) / J⌋ + 1``;
- ``floormod`` is a quirk: ``Analyzer::Bind`` with a range skips the modular-set analyzer,
  which keeps the loop at its minimum, so ``const_int_bound`` of any ``x % c`` collapses to
  one value and the dimension contributes extent 1 whatever the loop extents.

So a dimension whose index is a sum of (multiples of) loop variables, constants, ``floordiv``
of such sums by constants, ``floormod`` of anything and ``floordiv`` of a ``floormod`` (one
value too: a GPU thread index's ``t % 256 // 16``) is recorded as a ``Derivation``: its
extent at a loop level as a function of the open loops' extent leaves and of new leaves for
the expression's integers (coefficients, offsets, divisors: ``X:`` keys, fitted like every
other leaf, since a coefficient such as the 2 in ``ax0 * 2 + ax3 // 8`` moves with the
tiles). ``program.py`` keeps a derivation only where it reproduces the analyzer at the point
it was extracted from, at every level; other dimensions keep their fitted leaves.

    extent = 1 + Σ_q M_q · (F((O_q + Σ_pos X (E − 1)) / D_q) − F((O_q − Σ_neg X (E − 1)) / D_q))

over terms q (the plain linear part is the term M = D = 1, O = 0), with F = floor in exact mode.
The floor has no gradient: smooth mode takes each term's span as if the range were aligned to
D (``term_span``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from gradtune.symbolic import tir

# A floor of a value the formulas computed as 255.99999999997 must be 256: nudge by less than
# any real fraction (the numerator and divisor are integers, divisors below 10^5).
FLOOR_EPS = 1e-6


@dataclass
class Term:
    """``M · F((O + Σ c·t) / D)`` over loop offsets ``t ∈ [0, E − 1]`` (levels → signed c)."""

    mult: int
    offset: int
    divisor: int
    coefs: dict[int, int] = field(default_factory=dict)
    linear: bool = False  # the plain sum (M = D = 1, O = 0 by construction): no X leaves


@dataclass
class RegionForm:
    """One buffer dimension's index, as the terms its extent is computed from."""

    terms: list[Term]

    def extent(self, first_open: int | Callable[[int], bool], extents: list[int]) -> int:
        """The extent with loops at levels ≥ ``first_open`` open (the analyzer's answer), or
        at the levels ``first_open(level)`` says are open."""
        is_open = first_open if callable(first_open) else first_open.__le__
        total = 1
        for term in self.terms:
            hi = lo = term.offset
            for level, c in term.coefs.items():
                if is_open(level):
                    span = c * (extents[level] - 1)
                    hi, lo = (hi + span, lo) if c > 0 else (hi, lo + span)
            total += abs(term.mult) * (hi // term.divisor - lo // term.divisor)
        return total

    def shape(self, loop_keys: list[str]) -> str:
        """The form without its integers: part of the store's case signature."""
        parts = []
        for term in self.terms:
            loops = ",".join(
                f"{loop_keys[level]}{'+' if c > 0 else '-'}" for level, c in term.coefs.items()
            )
            parts.append(f"{'L' if term.linear else 'D'}({loops})")
        return "".join(parts)


@dataclass
class Derivation:
    """A region-extent leaf as a function of other leaves (``X:`` integers, loop extents)."""

    # Per term: (mult, offset, divisor: leaf keys, or numbers for the plain linear term),
    # [(coef key, extent key)] of the positive and of the negative coefficients among the
    # open loops.
    terms: list[
        tuple[str | float, str | float, str | float, list[tuple[str, str]], list[tuple[str, str]]]
    ]


@dataclass
class Quotient:
    """A loop extent that is a ceiling division: a fused loop split by factors that need not
    divide it (a GPU cooperative fetch split by threads × vector length, a block/thread split
    of an injective loop) has an outer extent ⌈N / D⌉, N the fused extent (the stored buffer's
    shape, a product of halos on a cache copy) and D the inner loops' extents. No monomial or
    affine form of the decisions is that. With no D it is a plain product of leaves (a fused
    index's divisor, the product of the copy's later dimensions)."""

    num: list[str]
    den: list[str]


def quotient(q: Quotient, leaf: Callable[[str], torch.Tensor], one: torch.Tensor) -> torch.Tensor:
    """⌈N / D⌉ in both modes; in smooth mode its gradient is the real quotient's (the value
    stays the ceiling: a loop runs a whole number of times)."""
    num, den = one, one
    for key in q.num:
        num = num * leaf(key)
    for key in q.den:
        den = den * leaf(key)
    return ceil_quotient(num, den)


def ceil_quotient(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    real = num / den
    return real + (torch.ceil(real - FLOOR_EPS) - real).detach()


def ceil_split(
    indices: list[Any], var_info: Callable[[Any], tuple[int, int] | None], extents: list[int]
) -> dict[int, list[int]]:
    """Loop levels whose extent is a ceiling division, from a store's index expressions: a
    fused index Σ c·t whose coefficients are a mixed radix (the innermost 1, each next one the
    previous times its loop's extent) is a split of one fused loop; its outermost level maps to
    the levels inside it (the divisor's loops)."""
    found: dict[int, list[int]] = {}

    def visit(expr: Any) -> None:
        term = _linear(expr, var_info) if tir.node_type(expr) in ("Add", "Mul") else None
        if term is None:
            for child in tir.children(expr):
                visit(child)
            return
        levels = sorted(term.coefs, key=lambda lv: term.coefs[lv])
        if len(levels) < 2 or term.coefs[levels[0]] != 1:
            return
        radix = 1
        for level in levels[:-1]:
            if term.coefs[level] != radix:
                return
            radix *= extents[level]
        if term.coefs[levels[-1]] == radix:
            found[levels[-1]] = levels[:-1]

    for expr in indices:
        visit(expr)
    return found


def _linear(expr: Any, var_info: Callable[[Any], tuple[int, int] | None]) -> Term | None:
    """``expr`` as O + Σ c·t (a Term with M = D = 1), or None if it is not that shape.
    ``var_info(var)``: (level, min) of a loop variable (level −1: a constant, its min)."""
    t = tir.node_type(expr)
    if t == "IntImm":
        return Term(1, int(expr.value), 1)
    if t == "Cast":
        return _linear(expr.value, var_info)
    if t == "Var":
        info = var_info(expr)
        if info is None:
            return None
        level, low = info
        return Term(1, low, 1, {level: 1} if level >= 0 else {})
    if t in ("Add", "Sub"):
        a, b = _linear(expr.a, var_info), _linear(expr.b, var_info)
        if a is None or b is None:
            return None
        sign = 1 if t == "Add" else -1
        coefs = dict(a.coefs)
        for level, c in b.coefs.items():
            coefs[level] = coefs.get(level, 0) + sign * c
        return Term(1, a.offset + sign * b.offset, 1, {k: c for k, c in coefs.items() if c})
    if t == "Mul":
        for const, other in ((expr.a, expr.b), (expr.b, expr.a)):
            if tir.node_type(const) == "IntImm":
                inner = _linear(other, var_info)
                if inner is None:
                    return None
                c = int(const.value)
                coefs = {k: v * c for k, v in inner.coefs.items() if v * c}
                return Term(1, inner.offset * c, 1, coefs)
    return None


def _summands(expr: Any, sign: int, out: list[tuple[int, Any]]) -> None:
    t = tir.node_type(expr)
    if t in ("Add", "Sub"):
        _summands(expr.a, sign, out)
        _summands(expr.b, sign if t == "Add" else -sign, out)
    elif t == "Cast":
        _summands(expr.value, sign, out)
    else:
        out.append((sign, expr))


def _known_vars(expr: Any, var_info: Callable[[Any], tuple[int, int] | None]) -> bool:
    return all(var_info(v) is not None for v in tir.vars_in(expr))


def parse_region(expr: Any, var_info: Callable[[Any], tuple[int, int] | None]) -> RegionForm | None:
    """The terms of one index expression, or None where the interval rules are not these."""
    summands: list[tuple[int, Any]] = []
    _summands(expr, 1, summands)
    linear = Term(1, 0, 1, linear=True)
    divs: list[Term] = []
    for sign, part in summands:
        mult, core = sign, part
        while tir.node_type(core) == "Mul":
            if tir.node_type(core.b) == "IntImm":
                mult, core = mult * int(core.b.value), core.a
            elif tir.node_type(core.a) == "IntImm":
                mult, core = mult * int(core.a.value), core.b
            else:
                break
        kind = tir.node_type(core)
        if kind == "FloorMod":
            # One value whatever the loops (the stale modular set, see the module docstring),
            # provided every variable in it was bound to a constant first.
            if tir.node_type(core.b) != "IntImm" or int(core.b.value) <= 0:
                return None
            if not _known_vars(core.a, var_info):
                return None
            continue
        if kind == "FloorDiv":
            if tir.node_type(core.b) != "IntImm" or int(core.b.value) <= 0:
                return None
            if tir.node_type(core.a) == "FloorMod":
                # The quotient of one value is one value: a fused thread index's
                # ``t % 256 // 16`` (a GPU cache copy or write-back).
                if parse_region(core.a, var_info) is None:
                    return None
                continue
            inner = _linear(core.a, var_info)
            if inner is None:
                return None
            if inner.coefs and mult:
                divs.append(Term(abs(mult), inner.offset, int(core.b.value), inner.coefs))
            continue
        term = _linear(part, var_info)
        if term is None:
            return None
        for level, c in term.coefs.items():
            linear.coefs[level] = linear.coefs.get(level, 0) + sign * c
    linear.coefs = {k: abs(c) for k, c in linear.coefs.items() if c}
    terms = ([linear] if linear.coefs else []) + divs
    return RegionForm(terms)


def inputs(derivation: Derivation | Quotient) -> list[str]:
    """The leaf keys a derived leaf is computed from."""
    if isinstance(derivation, Quotient):
        return [*derivation.num, *derivation.den]
    keys = []
    for m, o, d, pos, neg in derivation.terms:
        keys += [k for k in (m, o, d) if isinstance(k, str)]
        keys += [k for pair in (*pos, *neg) for k in pair]
    return keys


def depths(derived: dict[str, Derivation | Quotient]) -> dict[str, int]:
    """Per derived leaf, the pass it can be computed in: 0 when it reads only fitted leaves,
    else one more than the deepest derived leaf it reads (a copy's loop extent is a quotient
    of its buffer's shape, itself derived from a reader's region, and the copy's regions read
    that loop extent)."""
    out: dict[str, int] = {}

    def depth(key: str, path: tuple[str, ...]) -> int:
        if key not in out:
            if key in path:
                raise ValueError(f"derived leaves depend on each other in a cycle: {key}")
            reads = [k for k in inputs(derived[key]) if k in derived]
            out[key] = 1 + max((depth(k, (*path, key)) for k in reads), default=-1)
        return out[key]

    for key in derived:
        depth(key, ())
    return out


def derive(
    derivation: Derivation | Quotient,
    leaf: Callable[[str], torch.Tensor],
    mode: str,
    one: torch.Tensor,
) -> torch.Tensor:
    """The extent from the leaves (``leaf(key)``): the formula of the module docstring, or
    a ceiling division (``Quotient``)."""
    if isinstance(derivation, Quotient):
        return quotient(derivation, leaf, one)

    def value(key: str | float) -> torch.Tensor:
        return one * key if isinstance(key, float) else leaf(key)

    total = one
    for m_key, o_key, d_key, pos, neg in derivation.terms:
        offset, divisor = value(o_key), value(d_key)
        hi = offset + sum((value(c) * (value(e) - 1) for c, e in pos), torch.zeros_like(offset))
        lo = offset - sum((value(c) * (value(e) - 1) for c, e in neg), torch.zeros_like(offset))
        total = total + value(m_key) * term_span(hi, lo, divisor, mode)
    return no_gradient_when_empty(total)


def term_span(hi: torch.Tensor, lo: torch.Tensor, divisor: torch.Tensor, mode: str) -> torch.Tensor:
    """⌊hi / D⌋ − ⌊lo / D⌋; smooth: the distinct quotients of [lo, hi] minus one as if the
    range were aligned, (hi − lo + 1) / D − 1, which the floors give wherever D divides the
    range, rather than (hi − lo) / D, which overshoots by almost 1."""
    if mode == "exact":
        return torch.floor(hi / divisor + FLOOR_EPS) - torch.floor(lo / divisor + FLOOR_EPS)
    return ((hi - lo + 1) / divisor - 1).clamp(min=0)


def no_gradient_when_empty(extent: torch.Tensor) -> torch.Tensor:
    """An extent ≤ 0 (only a degenerate loop extent makes one) empties the region, and the
    features divide by it; its infinite gradient would otherwise reach every loop extent the
    region is derived from, and through them every feature's gradient."""
    return torch.where(extent > 0, extent, extent.detach())
