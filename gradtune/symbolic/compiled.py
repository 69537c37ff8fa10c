"""``features.evaluate`` compiled: a case's 164 features per store as a few batched tensor ops.

``evaluate`` builds every feature from scalar ops, so a case costs thousands of autograd nodes
and the cost grows with stores, accesses and loops. ``compile_case`` walks the same
computation once per case and records it as index and coefficient arrays over one vector of
*slots* per point (the case's leaves, then the constants it needs); ``evaluate_cases`` then
runs a fixed sequence of ops whatever the case, for points of several cases at once (each
point gathers through its own case's arrays, padded to the batch's largest case).

The computation is ``evaluate``'s, op for op, only batched: every product of leaves is one
row of a padded gather multiplied out left to right (``evaluate``'s association, so products
have its bits), sums of bytes are one reduction (exact on integers, an ulp from ``evaluate``
elsewhere), and the clamps, ``smooth_min``/``smooth_max``, the slot sort (9 significant
digits, then the name) and the arithmetic-intensity curve are ``evaluate``'s expressions on
whole tensors. Products are not taken in log space: a leaf may be 0, negative or NaN, and
the products must stay exactly what ``evaluate`` makes of them. Quantities ``evaluate`` does
not compute for a case (padding, stores without a curve) are computed from the constant 1 and
then discarded, so they can neither turn a feature NaN nor leak a NaN into a gradient.
``tests/test_symbolic_compiled.py`` holds it to ``evaluate`` on every sketch of several
operators.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gradtune.symbolic.features import (
    BUFFERS_PER_STORE,
    CURVE_SAMPLES,
    FEATURES,
    curve_at,
    slog,
    smooth_max,
    smooth_min,
)
from gradtune.symbolic.program import CACHE_LINE_BYTES, Program
from gradtune.symbolic.regions import Quotient, ceil_quotient, no_gradient_when_empty, term_span

# Slots 0 and 1 of every case hold 1.0 and 0.0: padding gathers slot 0, so a padded product
# is 1 (harmless in a quotient, exact in a product).
ONE, ZERO = 0, 1
_ACCESS_START = 57  # first buffer-access feature
_ACCESS_WIDTH = 18
_CURVE_START = _ACCESS_START + _ACCESS_WIDTH * BUFFERS_PER_STORE
# Output segments: slots, store-level raw values, per-access raw values, curve values.
_SLOTS, _STORE_RAW, _ACCESS_RAW, _CURVE = 0, 1, 2, 3
_ACCESS_RAW_WIDTH = 12
# Per access, the product rows gathered at once (columns of ``acc_rows``).
_ACC_ROW_COLUMNS = 10
_GPU_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y")
_GPU_TAGS += ("threadIdx.z", "vthread")
_ACC_COEF_COLUMNS = 6

# Padding value of every array a case carries: indices pad to slot/row 0 (the constant 1),
# coefficients to 1, masks to False.
_PADS: dict[str, Any] = {
    "kind": 0,
    "const": 1.0,
    "exps": 0.0,
    "log_coef": 0.0,
    "offset": 0.0,
    "cat_col": 0,
    "rows": ONE,
    "elem": False,
    "raw": 0,
    "acc_rows": 0,
    "acc_coef": 1.0,
    "no_loops": False,
    "serial": False,
    "terms": 0,
    "term_coef": 0.0,
    "chain": 0,
    "chain_on": False,
    "levels": ONE,
    "mem": 0,
    "mem_coef": 0.0,
    "level_on": False,
    "top": 0,
    # Derived region leaves (regions.py): a padded term is 0 · (1 − 1) and a padded leaf
    # computes 1 and writes it over the slot of the constant 1.
    "dv_slot": ONE,
    "dv_m": ZERO,
    "dv_o": ZERO,
    "dv_d": ONE,
    "dv_px": ZERO,
    "dv_pe": ONE,
    "dv_nx": ZERO,
    "dv_ne": ONE,
    # Ceiling-division loop extents (regions.Quotient): a padded one is ⌈1 / 1⌉ written over
    # the slot of the constant 1.
    "qv_slot": ONE,
    "qv_num": ONE,
    "qv_den": ONE,
}


@dataclass
class CompiledCase:
    """One case (program structure + leaf bank) as arrays; see the module docstring."""

    arrays: dict[str, np.ndarray]
    stores: int
    accesses: int
    # Output map per store: (segment, index within segment) of each of the 164 features;
    # the buffer-access block is filled per point from ``access_map`` after the slot sort.
    out_seg: np.ndarray  # (stores, 164)
    out_loc: np.ndarray
    access_seg: np.ndarray  # (accesses, 18)
    access_loc: np.ndarray
    access_store: np.ndarray  # (accesses,) store of each access, accesses store-major
    name_rank: np.ndarray  # (accesses,) rank of its buffer name among its store's
    names: list[str]  # buffer of each access (the NaN fallback sorts on it, as evaluate)
    store_accesses: list[list[int]]


class _Builder:
    """Slots, product rows and output references of one case, deduplicated."""

    def __init__(self, keys: list[str]) -> None:
        self.slot_of = {k: 2 + i for i, k in enumerate(keys)}
        self.first_const = 2 + len(keys)
        self.consts: dict[float, int] = {}
        self.rows: dict[tuple[tuple[int, ...], bool], int] = {}
        self.row_slots: list[tuple[int, ...]] = []
        self.row_elem: list[bool] = []
        self.row(())  # row 0: the empty product, 1
        self.row((ZERO,))  # row 1: 0
        self.raw: list[tuple[int, int, int]] = []

    def const(self, value: float) -> int:
        value = float(value)
        if value == 1.0:
            return ONE
        if value == 0.0 and math.copysign(1.0, value) > 0:
            return ZERO
        if value not in self.consts:
            self.consts[value] = self.first_const + len(self.consts)
        return self.consts[value]

    def slog_const(self, value: float) -> int:
        # The same torch op as evaluate's, so the constant has evaluate's bits.
        return self.const(float(slog(torch.tensor(float(value), dtype=torch.float64))))

    def leaf(self, key: str) -> int:
        return self.slot_of[key]

    def row(self, slots: tuple[int, ...] | list[int], elem: bool = False) -> int:
        """Product of slots, left to right (``elems``: clamped at 0 afterwards)."""
        key = (tuple(slots), elem)
        if key not in self.rows:
            self.rows[key] = len(self.row_slots)
            self.row_slots.append(key[0])
            self.row_elem.append(elem)
        return self.rows[key]

    def elems(self, dims: tuple[str, ...]) -> int:
        return self.row([self.leaf(k) for k in dims], elem=True)

    def raw_value(self, num: int, mul: int = 0, den: int = 0) -> tuple[int, int]:
        """Reference to row ``num`` × row ``mul`` / row ``den`` (rows default to 1)."""
        self.raw.append((num, mul, den))
        return (_STORE_RAW, len(self.raw) - 1)


def _padded(rows: list[list[Any]], pad: Any, dtype: Any, width: int | None = None) -> np.ndarray:
    width = max([len(r) for r in rows] + [1, width or 1])
    out = np.full((max(len(rows), 1), width), pad, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def compile_case(program: Program, bank: dict[str, Any]) -> CompiledCase:
    """Translate ``evaluate(program, leaves)`` for the leaves of ``bank`` (``SymbolicSketch.
    _bank``: the keys, in slot order, and their formulas) into arrays."""
    keys: list[str] = bank["keys"]
    b = _Builder(keys)
    zero, one = (_SLOTS, ZERO), (_SLOTS, ONE)
    n_stores = len(program.stores)
    out: list[list[tuple[int, int]]] = []
    # Per access, store-major in each store's access order.
    acc_rows, acc_coef, no_loops, serial = [], [], [], []
    terms, term_coef, chains = [], [], []
    access_refs, access_store, name_rank, names = [], [], [], []
    store_accesses: list[list[int]] = []
    # Per store: the curve.
    levels, mem, mem_coef, level_on, top = [], [], [], [], []

    for s, store in enumerate(program.stores):
        ext = [b.leaf(lp.key) for lp in store.loops]
        n = len(ext)
        prod = b.row(ext)
        feats: list[tuple[int, int]] = []

        # Group 1.
        for count in store.arith:
            feats.append(b.raw_value(b.row([*ext, b.const(count)])) if count else zero)
        for kind in ("vectorized", "unrolled", "parallel"):
            idx = [i for i, lp in enumerate(store.loops) if lp.kind == kind]
            if not idx:
                feats += [zero, zero, zero, one] + [zero] * 7
            else:
                feats.append((_SLOTS, b.slog_const(len(idx))))
                feats.append(b.raw_value(b.row([ext[i] for i in idx])))
                feats.append(b.raw_value(b.row((ext[idx[-1]],))))
                feats += [zero] * 7 + [one]
        slog_one = (_SLOTS, b.slog_const(1.0))
        if program.is_gpu:
            feats.append(one)
            for tag in _GPU_TAGS:
                first = [i for i, lp in enumerate(store.loops) if lp.tag == tag]
                feats.append(b.raw_value(b.row((ext[first[0]],))) if first else slog_one)
        else:
            feats += [zero] + [slog_one] * 7

        # Group 2: the per-access values; which five fill the slots is decided per point.
        mine = []
        for acc in store.accesses:
            a = len(acc_rows)
            mine.append(a)
            nbytes = float(acc.dtype_bytes)
            if n == 0:
                ub, ub_c = 0, 1.0
                inner = stride = cont = 0
                cont_c = 1.0
            else:
                ub, ub_c = b.elems(acc.numel_keys[0]), nbytes
                inner = b.row(ext[acc.stride_level + 1 :])
                stride = b.row([b.leaf(k) for k in acc.stride_keys])
                if acc.continuous_dim_key:
                    cont, cont_c = b.row((b.leaf(acc.continuous_dim_key),)), nbytes
                else:
                    cont, cont_c = 0, 1.0
            div = 0
            if acc.reuse_type == 0:
                i = acc.reuse_level
                rc, rc_c = b.row((ext[i],)), 1.0
                di, di_c = b.row(ext[i + 1 :]), 1.0
                if acc.distance_terms:
                    acc_terms = [(b.elems(k), float(nb)) for k, nb in acc.distance_terms]
                else:
                    acc_terms = [(0, float(acc.distance_const))]
                chain: list[int] = []
            elif acc.reuse_type == 1:
                i = acc.reuse_level
                rc, rc_c = 0, float(len(acc.serial_touched) - 1)
                di, di_c = 0, 1.0  # replaced by the chain's minimum
                chain = [b.elems(k) for k in acc.serial_touched]
                acc_terms = [(b.elems(k), float(nb)) for k, nb in acc.distance_terms]
                div = b.row((ext[i],))
            else:
                rc, rc_c, di, di_c, chain, acc_terms = 0, 0.0, 0, 0.0, [], []
            px, px_c = (rc, rc_c) if acc.reuse_type != 2 else (0, 0.5)
            innermost = acc.stride_level == n - 1 and n
            stride_f = b.row([b.leaf(k) for k in acc.stride_keys]) if innermost else 1
            acc_rows.append([prod, ub, inner, stride, cont, rc, px, di, div, stride_f])
            acc_coef.append([nbytes, ub_c, cont_c, rc_c, px_c, di_c])
            no_loops.append(n == 0)
            serial.append(acc.reuse_type == 1)
            terms.append([t for t, _ in acc_terms])
            term_coef.append([c for _, c in acc_terms])
            chains.append(chain)
            raw = [(_ACCESS_RAW, a * _ACCESS_RAW_WIDTH + j) for j in range(_ACCESS_RAW_WIDTH)]
            flags = [(_SLOTS, ONE if flag else ZERO) for flag in _flags(acc)]
            access_refs.append(flags[:3] + raw[:4] + flags[3:] + raw[4:])
            access_store.append(s)
            names.append(acc.buffer)
        ranks = {name: r for r, name in enumerate(sorted(acc.buffer for acc in store.accesses))}
        name_rank += [ranks[acc.buffer] for acc in store.accesses]
        store_accesses.append(mine)
        feats += [zero] * (_ACCESS_WIDTH * BUFFERS_PER_STORE)

        # Group 3: compute and memory per level, innermost first (as evaluate's lists).
        float_ops = sum(store.arith[:7])
        if float_ops <= 0 or n == 0:
            levels.append([])
            mem.append([[]])
            mem_coef.append([[]])
            level_on.append([])
            top.append(0)
            feats += [zero] * CURVE_SAMPLES
        else:
            levels.append([b.const(float_ops), *ext[::-1]])
            inward = range(n - 1, -1, -1)
            mem.append([[b.elems(a.numel_keys[i]) for a in store.accesses] for i in inward])
            mem_coef.append([[float(a.dtype_bytes) for a in store.accesses] for _ in range(n)])
            level_on.append([True] * n)
            top.append(n - 1)
            feats += [(_CURVE, s * CURVE_SAMPLES + k) for k in range(CURVE_SAMPLES)]

        # Groups 4 and 5.
        if store.alloc_shape_keys is not None:
            numel = [b.leaf(k) for k in store.alloc_shape_keys]
            outer = b.row([b.leaf(k) for k in store.alloc_loop_keys])
            feats.append(b.raw_value(b.row([*numel, b.const(store.alloc_dtype_bytes)])))
            feats.append(b.raw_value(b.row(numel), outer))
            feats.append(b.raw_value(outer))
            feats.append(b.raw_value(prod, 0, outer))
        else:
            feats += [zero, zero, slog_one, b.raw_value(prod)]
        unroll = [lp.unroll_key for lp in store.loops if lp.unroll_key]
        feats.append(b.raw_value(prod))
        feats.append((_SLOTS, b.slog_const(n)))
        feats.append(b.raw_value(b.row((b.leaf(unroll[-1]),))) if unroll else zero)
        assert len(feats) == FEATURES
        out.append(feats)

    derived = _derived_arrays(b, bank["derived"])
    arrays = _slot_arrays(b, bank)  # after every constant has its slot
    arrays.update(derived)
    length = max(len(r) for r in b.row_slots)
    arrays["rows"] = _padded([list(r) for r in b.row_slots], ONE, np.int64, length)
    arrays["elem"] = np.asarray(b.row_elem, dtype=bool)
    arrays["raw"] = _padded([list(r) for r in b.raw], 0, np.int64, 3)
    arrays["acc_rows"] = _padded(acc_rows, 0, np.int64, _ACC_ROW_COLUMNS)
    arrays["acc_coef"] = _padded(acc_coef, 1.0, np.float64, _ACC_COEF_COLUMNS)
    arrays["no_loops"] = np.asarray(no_loops or [False], dtype=bool)
    arrays["serial"] = np.asarray(serial or [False], dtype=bool)
    arrays["terms"] = _padded(terms, 0, np.int64)
    arrays["term_coef"] = _padded(term_coef, 0.0, np.float64)
    arrays["chain"] = _padded(chains, 0, np.int64)
    arrays["chain_on"] = _padded([[True] * len(c) for c in chains], False, bool)
    arrays["levels"] = _padded(levels, ONE, np.int64, 2)
    depth = arrays["levels"].shape[1] - 1
    width = max([len(level) for m in mem for level in m] + [1])
    arrays["mem"] = np.zeros((max(n_stores, 1), depth, width), dtype=np.int64)
    arrays["mem_coef"] = np.zeros((max(n_stores, 1), depth, width), dtype=np.float64)
    for s, (rows, coefs) in enumerate(zip(mem, mem_coef, strict=True)):
        for k, (r, c) in enumerate(zip(rows, coefs, strict=True)):
            arrays["mem"][s, k, : len(r)] = r
            arrays["mem_coef"][s, k, : len(c)] = c
    arrays["level_on"] = _padded(level_on, False, bool, depth)
    arrays["top"] = np.asarray(top or [0], dtype=np.int64)
    out_arr = np.asarray(out, dtype=np.int64).reshape(n_stores, FEATURES, 2)
    access_arr = np.asarray(access_refs, dtype=np.int64).reshape(-1, _ACCESS_WIDTH, 2)
    return CompiledCase(
        arrays=arrays,
        stores=n_stores,
        accesses=len(acc_rows),
        out_seg=out_arr[..., 0],
        out_loc=out_arr[..., 1],
        access_seg=access_arr[..., 0],
        access_loc=access_arr[..., 1],
        access_store=np.asarray(access_store, dtype=np.int64),
        name_rank=np.asarray(name_rank, dtype=np.int64),
        names=names,
        store_accesses=store_accesses,
    )


def compiled(program: Program, bank: dict[str, Any]) -> CompiledCase:
    """The compiled case of ``bank`` (``SymbolicSketch._bank`` of ``program``), built once."""
    case = bank.get("compiled")
    if case is None:
        case = bank["compiled"] = compile_case(program, bank)
    return case


def _derived_arrays(b: _Builder, derived: list[tuple[str, Any, int]]) -> dict[str, np.ndarray]:
    """The slots each derived leaf is computed from (``regions.derive``), padded, per pass:
    a leaf of pass p reads only fitted leaves and leaves of earlier passes."""

    def slot(key: str | float) -> int:
        return b.const(key) if isinstance(key, float) else b.leaf(key)

    passes = max([p for _, _, p in derived] + [0]) + 1
    quotients = [(key, d, p) for key, d, p in derived if isinstance(d, Quotient)]
    regions = [(key, d, p) for key, d, p in derived if not isinstance(d, Quotient)]

    def rows(items: list) -> int:  # leaves in the fullest pass
        return max([sum(p == q for *_, p in items) for q in range(passes)] + [1])

    def placed(items: list) -> list[tuple[int, int, str, Any]]:
        """(pass, row within the pass, key, derivation) of every item."""
        used = [0] * passes
        out = []
        for key, derivation, p in items:
            out.append((p, used[p], key, derivation))
            used[p] += 1
        return out

    width = max([len(d.num) for _, d, _ in quotients] + [len(d.den) for _, d, _ in quotients] + [1])
    shape = (passes, rows(quotients), width)
    out = {name: np.full(shape, ONE, np.int64) for name in ("qv_num", "qv_den")}
    out["qv_slot"] = np.full(shape[:2], ONE, np.int64)
    for p, i, key, q in placed(quotients):
        out["qv_slot"][p, i] = b.leaf(key)
        out["qv_num"][p, i, : len(q.num)] = [b.leaf(k) for k in q.num]
        out["qv_den"][p, i, : len(q.den)] = [b.leaf(k) for k in q.den]

    n = rows(regions)
    q = max([len(d.terms) for _, d, _ in regions] + [1])
    t = max([len(side) for _, d, _ in regions for term in d.terms for side in term[3:]] + [1])
    for name in ("dv_m", "dv_o", "dv_d"):
        out[name] = np.full((passes, n, q), _PADS[name], np.int64)
    for name in ("dv_px", "dv_pe", "dv_nx", "dv_ne"):
        out[name] = np.full((passes, n, q, t), _PADS[name], np.int64)
    out["dv_slot"] = np.full((passes, n), ONE, np.int64)
    for p, i, key, derivation in placed(regions):
        out["dv_slot"][p, i] = b.leaf(key)
        for j, (m, o, d, pos, neg) in enumerate(derivation.terms):
            out["dv_m"][p, i, j], out["dv_o"][p, i, j] = slot(m), slot(o)
            out["dv_d"][p, i, j] = slot(d)
            for k, (c, e) in enumerate(pos):
                out["dv_px"][p, i, j, k], out["dv_pe"][p, i, j, k] = slot(c), slot(e)
            for k, (c, e) in enumerate(neg):
                out["dv_nx"][p, i, j, k], out["dv_ne"][p, i, j, k] = slot(c), slot(e)
    return out


def _flags(acc: Any) -> list[bool]:
    return [acc.access_type == t for t in (0, 1, 2)] + [acc.reuse_type == t for t in (0, 1, 2)]


def _slot_arrays(b: _Builder, bank: dict[str, Any]) -> dict[str, np.ndarray]:
    """How each slot is computed: constant (the bank's, NaN for a leaf without formula, or a
    constant of the case), monomial of the log factors, or a categorical column."""
    n = b.first_const + len(b.consts)
    width = bank["exps"].shape[1]
    kind = np.zeros(n, dtype=np.int64)
    const = np.ones(n, dtype=np.float64)
    exps = np.zeros((n, width), dtype=np.float64)
    log_coef = np.zeros(n, dtype=np.float64)
    offset = np.zeros(n, dtype=np.float64)
    cat_col = np.zeros(n, dtype=np.int64)
    const[ZERO] = 0.0
    const[2 : b.first_const] = bank["const"][0].numpy()
    for value, slot in b.consts.items():
        const[slot] = value
    mono = bank["mono_idx"].numpy() + 2
    kind[mono] = 1
    exps[mono] = bank["exps"].numpy()
    log_coef[mono] = bank["log_coef"].numpy()
    offset[mono] = bank["offset"].numpy()
    cats = bank["cat_idx"].numpy() + 2
    kind[cats] = 2
    cat_col[cats] = bank["cat_col"].numpy()
    # A monomial or categorical slot's bank constant is NaN; the slot never reads it, but
    # keep it finite so that no unselected branch holds a NaN.
    const[kind != 0] = 1.0
    return {
        "kind": kind,
        "const": const,
        "exps": exps,
        "log_coef": log_coef,
        "offset": offset,
        "cat_col": cat_col,
    }


# -- a batch of points over several cases ------------------------------------------------------


@dataclass
class _Plan:
    cases: list[CompiledCase]  # per point
    tensors: dict[str, torch.Tensor]  # per point, padded to the batch's largest case
    any_mono: bool
    any_cat: bool
    any_no_loops: bool
    any_serial: bool
    any_derived: bool
    any_quotient: bool
    passes: int  # of the derived leaves (regions.depths)
    stores: int  # padded
    accesses: int
    # The slot sort's inputs: the (point, access) pairs that exist.
    pts: np.ndarray
    accs: np.ndarray
    access_store: np.ndarray
    name_rank: np.ndarray
    # Output gather indices before the sort (batch, stores, 164), and each access's 18
    # feature indices (batch, accesses + 1, 18; the last row is all zeros, for empty slots).
    out_index: np.ndarray
    access_index: np.ndarray


_PLANS: OrderedDict[tuple[int, ...], _Plan] = OrderedDict()
_PLAN_CACHE = 64


def _stack(arrays: list[np.ndarray], pad: Any) -> np.ndarray:
    shape = np.max([a.shape for a in arrays], axis=0)
    out = np.full((len(arrays), *shape), pad, dtype=arrays[0].dtype)
    for g, a in enumerate(arrays):
        out[(g, *[slice(0, d) for d in a.shape])] = a
    return out


def _plan(cases: list[CompiledCase]) -> _Plan:
    key = tuple(id(c) for c in cases)
    plan = _PLANS.get(key)
    if plan is not None:
        _PLANS.move_to_end(key)
        return plan
    distinct: list[CompiledCase] = []
    group: dict[int, int] = {}
    for c in cases:
        if id(c) not in group:
            group[id(c)] = len(distinct)
            distinct.append(c)
    of_point = np.asarray([group[id(c)] for c in cases], dtype=np.int64)
    stacked = {
        name: _stack([c.arrays[name] for c in distinct], pad)[of_point]
        for name, pad in _PADS.items()
    }
    batch = len(cases)
    width = {
        _SLOTS: stacked["const"].shape[1],
        _STORE_RAW: stacked["raw"].shape[1],
        _ACCESS_RAW: stacked["acc_rows"].shape[1] * _ACCESS_RAW_WIDTH,
        _CURVE: stacked["top"].shape[1] * CURVE_SAMPLES,
    }
    offsets = np.cumsum([0] + [width[s] for s in (_SLOTS, _STORE_RAW, _ACCESS_RAW)])
    stores = max(max(c.stores for c in cases), 1)
    accesses = stacked["acc_rows"].shape[1]
    out_index = np.full((batch, stores, FEATURES), ZERO, dtype=np.int64)
    access_index = np.full((batch, accesses + 1, _ACCESS_WIDTH), ZERO, dtype=np.int64)
    for p, c in enumerate(cases):
        out_index[p, : c.stores] = offsets[c.out_seg] + c.out_loc
        access_index[p, : c.accesses] = offsets[c.access_seg] + c.access_loc
    counts = np.asarray([c.accesses for c in cases])
    pts, accs = np.nonzero(np.arange(accesses)[None] < counts[:, None])
    access_store = np.zeros((batch, accesses), dtype=np.int64)
    name_rank = np.zeros((batch, accesses), dtype=np.int64)
    for p, c in enumerate(cases):
        access_store[p, : c.accesses] = c.access_store
        name_rank[p, : c.accesses] = c.name_rank
    stacked["rows"] = stacked["rows"].transpose(0, 2, 1)  # factors along dim 1, see prod
    tensors = {name: torch.from_numpy(np.ascontiguousarray(a)) for name, a in stacked.items()}
    high = [1.0] * accesses + [float(CACHE_LINE_BYTES)] * accesses
    tensors["clamp_high"] = torch.tensor(high, dtype=torch.float64)
    kind = tensors.pop("kind")
    tensors["is_mono"] = kind == 1
    tensors["is_cat"] = kind == 2
    plan = _Plan(
        cases=list(cases),
        tensors=tensors,
        any_mono=bool(tensors["is_mono"].any()),
        any_cat=bool(tensors["is_cat"].any()),
        any_no_loops=bool(tensors["no_loops"].any()),
        any_serial=bool(tensors["serial"].any()),
        any_derived=bool((tensors["dv_slot"] != ONE).any()),
        any_quotient=bool((tensors["qv_slot"] != ONE).any()),
        passes=tensors["dv_slot"].shape[1],
        stores=stores,
        accesses=accesses,
        pts=pts,
        accs=accs,
        access_store=access_store[pts, accs],
        name_rank=name_rank[pts, accs],
        out_index=out_index,
        access_index=access_index,
    )
    _PLANS[key] = plan
    if len(_PLANS) > _PLAN_CACHE:
        _PLANS.popitem(last=False)
    return plan


def _take(source: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``source[p, index[p, ...]]`` for every point p: one gather whatever index's shape."""
    batch = source.shape[0]
    return source.gather(1, index.reshape(batch, -1)).view(index.shape)


def evaluate_cases(
    cases: list[CompiledCase], log_f: torch.Tensor, cats: torch.Tensor, mode: str = "exact"
) -> list[torch.Tensor]:
    """Features of point i of (log factors, categoricals) in case ``cases[i]``: per point a
    (stores, 164) float64 tensor, equal to ``evaluate`` of that case at that point's leaves."""
    if mode not in ("exact", "smooth"):
        raise ValueError(f"mode must be 'exact' or 'smooth', not {mode!r}")
    if not cases:
        return []
    plan = _plan(cases)
    t = plan.tensors
    batch = len(cases)
    f64 = torch.float64

    # Slots: the leaves as SymbolicSketch.leaves computes them, and the case's constants.
    slots = t["const"]
    if plan.any_mono:
        # Per point through its own case's formulas only (no table shared across cases), so
        # that nothing another case computes can reach this point's gradient.
        logs = (t["exps"] @ log_f.to(f64)[:, :, None])[..., 0]
        mono = torch.exp(t["log_coef"] + logs) + t["offset"]
        slots = torch.where(t["is_mono"], mono, slots)
    if plan.any_cat:
        slots = torch.where(t["is_cat"], cats.to(f64).gather(1, t["cat_col"]), slots)
    # Derived leaves, pass by pass: each pass reads the slots the passes before it wrote.
    for p in range(plan.passes):
        if plan.any_quotient:
            num = _take(slots, t["qv_num"][:, p]).prod(-1)
            den = _take(slots, t["qv_den"][:, p]).prod(-1)
            slots = slots.scatter(1, t["qv_slot"][:, p], ceil_quotient(num, den))
        if plan.any_derived:

            def at(name: str, p: int = p, slots: torch.Tensor = slots) -> torch.Tensor:
                return _take(slots, t[name][:, p])

            span_pos = (at("dv_px") * (at("dv_pe") - 1)).sum(-1)
            span_neg = (at("dv_nx") * (at("dv_ne") - 1)).sum(-1)
            offset, divisor = at("dv_o"), at("dv_d")
            span = term_span(offset + span_pos, offset - span_neg, divisor, mode)
            extent = no_gradient_when_empty(1 + (at("dv_m") * span).sum(-1))
            slots = slots.scatter(1, t["dv_slot"][:, p], extent)

    # Every product of leaves; elems clamped. The factors lie along dim 1, so that ``prod``
    # multiplies them one after the other, left to right: evaluate's association, its bits.
    products = _take(slots, t["rows"]).prod(1)
    products = torch.where(t["elem"], products.clamp(min=0), products)

    # Group 2's per-access values, as evaluate builds each access's vector.
    one = torch.ones((), dtype=f64)
    (prod, ub, inner, stride, cont, rc, px, di, div, stride_f) = _take(
        products, t["acc_rows"]
    ).unbind(-1)
    nbytes, ub_c, cont_c, rc_c, px_c, di_c = t["acc_coef"].unbind(-1)
    bytes_ = prod * nbytes
    unique_bytes = ub * ub_c
    ratio = stride * nbytes / CACHE_LINE_BYTES
    # evaluate's four clamps, two at a time (each smooth_min/max call is a dozen nodes):
    # min(1, ratio) with min(64, continuous), then max(1, lines) with max(1, unique lines).
    capped = smooth_min(t["clamp_high"], torch.cat([ratio, cont * cont_c], -1), mode)
    ratio_min, cont_min = capped.split(plan.accesses, -1)
    floored = torch.cat([prod / inner * ratio_min, unique_bytes / cont_min], -1)
    lines, unique_lines = smooth_max(one, floored, mode).split(plan.accesses, -1)
    if plan.any_no_loops:
        lines = torch.where(t["no_loops"], one, lines)
        unique_lines = torch.where(t["no_loops"], one, unique_lines)
    reuse_ct = rc * rc_c
    proxy = px * px_c
    numer = di * di_c
    if plan.any_serial:
        chain = _take(products, t["chain"])
        low = chain[..., 0]
        for k in range(1, chain.shape[-1]):
            step = smooth_min(low, chain[..., k], mode)
            low = torch.where(t["chain_on"][..., k], step, low)
        numer = torch.where(t["serial"], low, numer)
    dis_iter = numer / div
    # Sums in any order: exact on integers, within an ulp of evaluate's elsewhere.
    dis_bytes = (_take(products, t["terms"]) * t["term_coef"]).sum(-1) / div
    sized = torch.stack([bytes_, unique_bytes, lines, unique_lines], -1)
    access_raw = torch.cat(
        [
            sized,
            torch.stack([dis_iter, dis_bytes, reuse_ct], -1),
            sized / proxy[..., None],
            stride_f[..., None],
        ],
        -1,
    )

    # Group 3, as evaluate's _intensity_curve on every store at once.
    # (batch, stores, levels): cumprod is sequential; its backward is cheap without zeros.
    compute = _take(slots, t["levels"]).cumprod(-1)[..., 1:]
    memory = (_take(products, t["mem"]) * t["mem_coef"]).sum(-1)
    # Padded levels and stores without a curve have no bytes: 1, not 0, so that their
    # (discarded) quotients stay finite and no NaN reaches the gradients through them.
    memory = torch.where(t["level_on"], memory, one)
    total = compute.gather(2, t["top"][..., None])
    fractions = torch.arange(1, CURVE_SAMPLES + 1, dtype=f64) / CURVE_SAMPLES
    cur = fractions * total  # (batch, stores, samples)
    reached = compute.detach()[:, :, None, :] >= (cur.detach()[..., None] - 1e-4)
    reached = reached & t["level_on"][:, :, None, :]
    p = torch.argmax(reached.to(torch.int64), -1)
    curve = curve_at(compute, memory, cur, p, 2)

    # Groups 1, 4, 5: products and quotients of products.
    num, mul, den = _take(products, t["raw"]).unbind(-1)
    store_raw = num * mul / den

    raw = torch.cat([store_raw, access_raw.reshape(batch, -1), curve.reshape(batch, -1)], 1)
    values = torch.cat([slots, slog(raw)], 1)
    order = _slot_order(plan, lines.detach().numpy(), bytes_.detach().numpy())
    index = plan.out_index.copy()
    chosen = plan.access_index[np.arange(batch)[:, None, None], order]
    index[:, :, _ACCESS_START:_CURVE_START] = chosen.reshape(batch, plan.stores, -1)
    feats = values.gather(1, torch.from_numpy(index.reshape(batch, -1)))
    per_point = feats.view(batch, plan.stores, FEATURES).unbind(0)
    # Slice only the points with fewer stores: each slice is one more backward node.
    pairs = zip(per_point, cases, strict=True)
    return [f if c.stores == plan.stores else f[: c.stores] for f, c in pairs]


def _round9(values: np.ndarray) -> np.ndarray:
    return np.asarray([float(f"{v:.9g}") for v in values.tolist()], dtype=np.float64)


def _slot_order(plan: _Plan, lines: np.ndarray, bytes_: np.ndarray) -> np.ndarray:
    """Per point and store, the accesses filling the five slots (``plan.accesses`` where
    empty): evaluate's sort by lines, then bytes (both descending at 9 significant digits),
    then buffer name — as one lexsort over all points and stores."""
    batch = len(plan.cases)
    order = np.full((batch, plan.stores, BUFFERS_PER_STORE), plan.accesses, dtype=np.int64)
    pts, accs = plan.pts, plan.accs
    if not len(pts):
        return order
    lines9 = _round9(lines[pts, accs])
    bytes9 = _round9(bytes_[pts, accs])
    store = plan.access_store
    ranked = np.lexsort((plan.name_rank, -bytes9, -lines9, store, pts))
    group = (pts * plan.stores + store)[ranked]
    rank = np.arange(len(ranked)) - np.searchsorted(group, group, side="left")
    keep = rank < BUFFERS_PER_STORE
    order[pts[ranked][keep], store[ranked][keep], rank[keep]] = accs[ranked][keep]
    nan = np.isnan(lines9) | np.isnan(bytes9)
    if nan.any():
        # NaN keys have no order: replay evaluate's own sorted() on them, for its tie-breaks.
        for p, s in sorted(set(zip(pts[nan].tolist(), store[nan].tolist(), strict=True))):
            case = plan.cases[p]
            mine = case.store_accesses[s]

            def key(i: int, p: int = p, mine: list[int] = mine, case: CompiledCase = case):
                a = mine[i]
                return (-float(f"{lines[p, a]:.9g}"), -float(f"{bytes_[p, a]:.9g}"), case.names[a])

            picked = [mine[i] for i in sorted(range(len(mine)), key=key)[:BUFFERS_PER_STORE]]
            order[p, s] = plan.accesses
            order[p, s, : len(picked)] = picked
    return order
