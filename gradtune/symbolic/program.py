"""The structure of a scheduled program as TVM's ``PerStoreFeature`` sees it, with every
integer that depends on the schedule's decisions lifted out as a named *leaf*.

``extract_program(mod)`` lowers a scheduled IRModule exactly as ``PerStoreFeature`` does and
walks it like its C++ collector (``per_store_feature.cc``). What depends only on the loop
structure (which loops exist, their kinds, which buffers each store touches, op counts per
iteration, which loop carries the reuse, the order of buffer slots) is recorded as plain
data: that is the *case* of the program. Every number that moves with the tile sizes (loop
extents, elements touched per loop level, strides, buffer shapes, unroll steps) is recorded
as a leaf key plus its value at this point. ``features.evaluate`` recomputes the 164 features
from the case and any leaf values: the concrete ones (a port of the extractor) or the leaf
*formulas* of the decisions (``formulas.py``), which is what makes them differentiable.

Traps copied from the C++ (each changes features): serial, unannotated extent-1 loops are
dropped before extraction (their variables become 0); a ``Select`` without buffer loads is the
constant 1; comparisons are counted as integer ops (their type is bool); the stride extractor
keeps the last multiplying constant; loops are keyed by node, never by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from gradtune.symbolic import tir
from gradtune.symbolic.regions import Derivation, Quotient, ceil_split, inputs, parse_region

CACHE_LINE_BYTES = 64

# Order of the 16 arithmetic counters, as exported.
ARITH_NAMES = (
    "float_mad",
    "float_add_sub",
    "float_mul",
    "float_div_mod",
    "float_cmp",
    "float_math_func",
    "float_other_func",
    "int_mad",
    "int_add_sub",
    "int_mul",
    "int_div_mod",
    "int_cmp",
    "int_math_func",
    "int_other_func",
    "bool_op",
    "select_op",
)
_BINARY = {
    "Add": "add_sub",
    "Sub": "add_sub",
    "Mul": "mul",
    "Div": "div_mod",
    "Mod": "div_mod",
    "FloorDiv": "div_mod",
    "FloorMod": "div_mod",
    "Max": "cmp",
    "Min": "cmp",
    "EQ": "cmp",
    "NE": "cmp",
    "LT": "cmp",
    "LE": "cmp",
    "GT": "cmp",
    "GE": "cmp",
}
_THREAD_TAGS = (
    "blockIdx.x",
    "blockIdx.y",
    "blockIdx.z",
    "threadIdx.x",
    "threadIdx.y",
    "threadIdx.z",
)


@dataclass
class Loop:
    key: str  # leaf key of its extent
    kind: str  # serial | parallel | vectorized | unrolled | thread
    tag: str = ""  # thread tag for thread bindings ("vthread" for any vthread.*)
    unroll_key: str = ""  # leaf key of pragma_auto_unroll_max_step when > 0
    quotient: bool = False  # its extent is derived as a ceiling division (regions.Quotient)


@dataclass
class Access:
    """One buffer a store touches (a ``SubFeature`` in the C++)."""

    buffer: str
    dtype_bytes: int
    access_type: int  # 0 read, 1 write, 2 read-write
    # Per loop level, outer to inner: the extent leaves, per buffer dimension, of the region
    # touched by loops i..n-1 (elements = their product, clamped at 0).
    numel_keys: list[tuple[str, ...]]
    stride_level: int  # the innermost loop with a non-zero stride on this buffer, or -1
    # Leaves whose product is that stride (elements): the loop's coefficient in the index of
    # one dimension, then the buffer's shape leaves of the dimensions after it.
    stride_keys: tuple[str, ...]
    continuous_dim_key: str  # leaf: buffer shape of the innermost fully covered dim, or ""
    reuse_type: int  # 0 loop multiple read, 1 serial multiple read/write, 2 none
    reuse_level: int
    # Serial reuse: the numel keys accessed under the reuse loop (this buffer), and all buffers'.
    serial_touched: list[tuple[str, ...]] = field(default_factory=list)
    # Reuse distance in bytes: (numel key, dtype bytes) summed; for loop reuse at the innermost
    # loop the C++ uses a constant instead (top_loop_touch_bytes).
    distance_terms: list[tuple[tuple[str, ...], int]] = field(default_factory=list)
    distance_const: float = 0.0
    # Per dimension, the shape of its derived region extent (regions.py), "?" if fitted.
    region_form: str = ""


@dataclass
class Store:
    buffer: str
    loops: list[Loop]
    arith: list[int]  # per-iteration op counts, ARITH_NAMES order
    accesses: list[Access]  # in the C++'s sorted slot order at this point
    alloc_shape_keys: list[str] | None  # group 4: the buffer's allocation, if any
    alloc_loop_keys: list[str]
    alloc_dtype_bytes: int = 4


@dataclass
class Program:
    """One case of a sketch: structure plus leaf keys; ``values`` are the leaves here."""

    stores: list[Store]
    is_gpu: bool
    values: dict[str, int]
    # GPU constraints' inputs: every allocation (name, shape keys, dtype bytes, scope), and
    # every block with a thread-extent range (threadIdx loop keys bound there, low, high).
    allocations: list[tuple[str, list[str], int, str]] = field(default_factory=list)
    thread_checks: list[tuple[list[str], int, int]] = field(default_factory=list)
    # GPU kernels (VerifyGPUCode counts per kernel): every thread-bound loop as (kernel, tag,
    # extent key), the kernel being the key of its outermost thread-bound loop; and the kernel
    # of each entry of ``allocations`` ("" outside any kernel).
    thread_loops: list[tuple[str, str, str]] = field(default_factory=list)
    alloc_kernels: list[str] = field(default_factory=list)
    # Software-pipelined loops (InjectSoftwarePipeline, run by VerifyGPUCode's lowering): (loop
    # key, stage annotation, children of the pipeline body, versions per buffer it allocates).
    pipelines: list[tuple[str, list[int], int, dict[str, int]]] = field(default_factory=list)
    # Leaves computed from other leaves rather than fitted (regions.py): region extents, and
    # ceiling-division loop extents, cache shapes and divisors (products/quotients of leaves).
    derived: dict[str, Derivation | Quotient] = field(default_factory=dict)
    _signature: str | None = field(default=None, repr=False, compare=False)
    _store_signatures: dict[str, str] | None = field(default=None, repr=False, compare=False)

    def signature(self) -> str:
        """Structure only (no leaf values): two points with equal signatures share a case."""
        if self._signature is None:
            self._signature = self._make_signature()
        return self._signature

    def store_signature(self, buffer: str) -> str:
        """The structure of one store's loop nest and accesses ("" if it has none)."""
        if self._store_signatures is None:
            self._store_signatures = {s.buffer: self._store_part(s) for s in self.stores}
        return self._store_signatures.get(buffer, "")

    def _make_signature(self) -> str:
        return "|".join(self._store_part(s) for s in self.stores)

    @staticmethod
    def _store_part(s: Store) -> str:
        loops = ",".join(
            f"{lp.key}:{lp.kind}{lp.tag}{'U' if lp.unroll_key else ''}{'Q' if lp.quotient else ''}"
            for lp in s.loops
        )
        acc = ";".join(
            f"{a.buffer}/{a.access_type}/{a.stride_level}/{a.stride_keys}/{a.continuous_dim_key}/"
            f"{a.reuse_type}/{a.reuse_level}/{len(a.serial_touched)}/{a.region_form}"
            for a in s.accesses
        )
        return f"{s.buffer}[{loops}]{s.arith}{{{acc}}}{s.alloc_shape_keys}"


def simplify_for_feature_extraction(mod: Any) -> Any:
    """``SimplifyForFeatureExtraction``, the C++ pass ``PerStoreFeature`` runs first, which
    TVM does not expose to Python: serial, unannotated unit loops disappear (their variables
    become 0), zero-extent loops become no-ops, and a ``Select`` without buffer loads becomes
    the constant 1. Where it runs matters: before ``LowerCrossThreadReduction``, a reduction
    whose in-thread loop has extent 1 is lowered without the in-thread buffer and its stores
    (a GPU softmax has two stores fewer)."""
    import tvm
    import tvm_ffi
    from tvm import tirx

    def simplify(func: Any) -> Any:
        unit: list[Any] = []

        def on_for(loop: Any) -> Any:
            # Pre-order: what this returns is not offered to the callbacks again, only its
            # children are, so a nest of unit loops is peeled here, all at once.
            while isinstance(loop, tirx.For):
                extent, low = loop.extent, loop.min
                if isinstance(extent, tirx.IntImm) and int(extent.value) == 0:
                    return tirx.Evaluate(0)
                if not (
                    isinstance(low, tirx.IntImm)
                    and int(low.value) == 0
                    and isinstance(extent, tirx.IntImm)
                    and int(extent.value) == 1
                    and int(loop.kind) == 0
                    and len(loop.annotations) == 0
                ):
                    break
                unit.append(loop.loop_var)  # its uses in the body, mapped next, become 0
                loop = loop.body
            return loop

        def on_var(var: Any) -> Any:
            if any(var.same_as(u) for u in unit):
                return tirx.const(0, var.ty.dtype)
            return var

        def on_select(select: Any) -> Any:
            if any(
                tir.has_load(e) for e in (select.true_value, select.false_value, select.condition)
            ):
                return select
            return tirx.const(1, select.dtype)

        return tvm_ffi.structural_map(
            func,
            [(tirx.For, on_for), (tirx.Var, on_var), (tirx.Select, on_select)],
            order="pre",
        )

    functions = {
        gv: simplify(f) if isinstance(f, tirx.PrimFunc) else f for gv, f in mod.functions.items()
    }
    return tvm.IRModule(functions, attrs=mod.attrs)


def lower_for_features(mod: Any) -> Any:
    """The pass list ``PerStoreFeature`` runs before extracting."""
    import tvm
    from tvm import s_tir, tirx

    mod = s_tir.transform.RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    mod = simplify_for_feature_extraction(mod)
    passes = tvm.transform.Sequential(
        [
            s_tir.transform.LowerCrossThreadReduction(),
            s_tir.transform.LowerInitBlock(),
            s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
            s_tir.transform.ConvertBlocksToOpaque(),
            s_tir.transform.CompactBufferAllocation(),
            tirx.transform.StmtSimplify(),
            s_tir.transform.LowerAutoCopy(),
            s_tir.transform.UnifyThreadBinding(),
            s_tir.transform.LowerMatchBuffer(),
            tirx.transform.StmtSimplify(),
        ]
    )
    return passes(mod)


def _is_float(dtype: Any) -> bool:
    return str(dtype).startswith("float")


def _call_is_pure(call: Any) -> bool:
    import tvm

    op = call.op
    if not isinstance(op, tvm.ir.Op):
        return False
    effect = op.get_attr("TCallEffectKind")
    # CallEffectKind: 0 expr annotation, 1 pure, others have effects.
    return effect is not None and int(effect) in (0, 1)


_ARITH_SLOT = {name: i for i, name in enumerate(ARITH_NAMES)}


def scan_value(expr: Any) -> tuple[list[int], list[tuple[Any, list[Any]]]]:
    """A store value's per-iteration op counts (the C++ multiplies them by the loop product)
    and its buffer loads, (buffer, indices) in post-order, from one walk: a fused epilogue's
    value has hundreds of nodes, and walking it once per question was a large share of
    extracting a program."""
    slot = _ARITH_SLOT
    counts = [0] * len(ARITH_NAMES)
    loads: list[tuple[Any, list[Any]]] = []

    def visit(e: Any) -> bool:
        """Count ``e``'s subtree; whether it reads a buffer."""
        t = tir.node_type(e)
        before = counts.copy() if t == "Select" else None
        if t in tir.LOADS:
            indices = list(e.indices)
            for c in indices:
                visit(c)
            loads.append((tir.load_buffer(e), indices))
            return True
        reads = False
        for c in tir.children(e):
            reads = visit(c) or reads
        if t in ("And", "Or", "Not"):
            counts[slot["bool_op"]] += 1
        elif t == "Select":
            if not reads:  # SimplifyForFeatureExtraction turns it into the constant 1
                counts[:] = before
                return False
            counts[slot["select_op"]] += 1
        elif t in _BINARY:
            prefix = "float_" if _is_float(e.ty) else "int_"
            counts[slot[prefix + _BINARY[t]]] += 1
        elif t == "Call" or t in tir.BITWISE:
            pure = t in tir.BITWISE or _call_is_pure(e)
            prefix = "float_" if _is_float(e.ty) else "int_"
            counts[slot[prefix + ("math_func" if pure else "other_func")]] += 1
        return reads

    visit(expr)
    return counts, loads


def _coefficients(expr: Any) -> dict[int, int]:
    """``CoefficientExtractor`` of every variable of ``expr`` at once, keyed by the variable's
    handle (absent: 0). Its state machine runs per variable over one post-order listing of the
    expression: a store asks it for each loop of its nest, index and dimension, and walking
    the expression once per question was most of a program's extraction."""
    order: list[tuple[str, int]] = []  # post-order (node type, var handle or Mul constant)

    def walk(e: Any) -> None:
        for c in tir.children(e):
            walk(c)
        t = tir.node_type(e)
        if t == "Var":
            order.append((t, e.__chandle__()))
        elif t == "Mul":
            if tir.node_type(e.a) == "IntImm":
                order.append((t, int(e.a.value)))
            elif tir.node_type(e.b) == "IntImm":
                order.append((t, int(e.b.value)))
        elif t == "Add":
            order.append((t, 0))

    walk(expr)
    out = {}
    for handle in {h for t, h in order if t == "Var"}:
        seen, add, mul, stride = False, False, False, 0
        for t, v in order:
            if t == "Var":
                if v == handle:
                    seen, stride = True, 2
            elif t == "Mul":
                # A product without a constant factor: neither branch of the C++ applies.
                if seen and not add:
                    mul, stride = True, v
            elif seen and not mul:
                add, stride = True, 1
        out[handle] = 1 if not mul and not add else stride
    return out


def _shape(buffer: Any) -> list[int]:
    return [int(s.value) if tir.node_type(s) == "IntImm" else 1 for s in buffer.shape]


def _scope(buffer: Any) -> str:
    try:
        return str(buffer.scope())
    except (AttributeError, TypeError):
        return "global"


def _relaxed(scope: str, tag: str) -> bool:
    """Whether ``CompactBufferAllocation`` sizes a buffer of ``scope`` over all the values of
    a loop bound to thread ``tag`` that encloses the allocation (``CanRelaxStorageUnderThread``:
    a storage rank at most the thread's rank; warp memory only over threadIdx.x)."""
    rank = {"global": 0, "shared": 1, "warp": 2, "local": 3}.get(scope.split(".")[0], 3)
    if not tag:
        return False
    if rank == 2:
        return tag == "threadIdx.x"
    return rank <= (0 if tag.startswith("blockIdx") else 1)


def _bytes(buffer: Any) -> int:
    import tvm

    dtype = tvm.runtime.DataType(str(buffer.dtype))
    return max(1, (dtype.bits * dtype.lanes + 7) // 8)


class _Collector:
    def __init__(self, is_gpu: bool) -> None:
        import tvm

        self.is_gpu = is_gpu
        self.analyzer = tvm.sym.Analyzer()
        self.values: dict[str, int] = {}
        self.nest: list[tuple[Any, Loop]] = []  # (For node, Loop)
        self.loop_ids: dict[int, str] = {}
        self.key_counts: dict[str, int] = {}
        self.store_counts: dict[str, int] = {}
        # loop key → buffer → [numel keys], in visiting order (C++ buffer_touched_under_loop)
        self.touched: dict[str, dict[str, list[tuple[str, ...]]]] = {}
        self.buffer_bytes: dict[str, int] = {}
        self.stores: dict[str, Store] = {}  # by buffer name, first-store order
        self.allocs: dict[str, tuple[list[str], list[str], int]] = {}
        self.shape_keys: dict[str, list[str]] = {}
        self.first_order: list[str] = []
        self.allocations: list[tuple[str, list[str], int, str]] = []
        self.thread_checks: list[tuple[list[str], int, int]] = []
        self.thread_loops: list[tuple[str, str, str]] = []
        self.alloc_kernels: list[str] = []
        self.pipelines: list[tuple[str, list[int], int, dict[str, int]]] = []
        self.unit_vars: list[tuple[Any, int]] = []  # removed unit loops in scope: (var, min)
        self.alloc_at: dict[str, tuple[int, str]] = {}  # buffer → (nest depth, scope) of its alloc
        self.derived: dict[str, Derivation | Quotient] = {}

    # -- leaves --------------------------------------------------------------------------
    def leaf(self, key: str, value: int) -> str:
        self.values[key] = int(value)
        return key

    def buffer_shape_keys(self, buffer: Any) -> list[str]:
        name = buffer.name
        if name not in self.shape_keys:
            self.shape_keys[name] = [
                self.leaf(f"B:{name}:{d}", v) for d, v in enumerate(_shape(buffer))
            ]
        return self.shape_keys[name]

    def loop_key(self, loop: Any) -> str:
        if loop.id_ not in self.loop_ids:
            base = f"L:{loop.loop_var.name}@{_first_store(loop.body) or '-'}"
            n = self.key_counts.get(base, 0)
            self.key_counts[base] = n + 1
            self.loop_ids[loop.id_] = base if n == 0 else f"{base}#{n}"
        return self.loop_ids[loop.id_]

    # -- walk ----------------------------------------------------------------------------
    def visit(self, stmt: Any) -> None:
        t = tir.node_type(stmt)
        if t == "For":
            self.visit_for(stmt)
        elif t == "SeqStmt":
            for s in stmt.seq:
                self.visit(s)
        elif t == "SBlockRealize":
            self.visit(stmt.block)
        elif t == "SBlock":
            low = stmt.annotations.get("meta_schedule.thread_extent_low_inclusive")
            high = stmt.annotations.get("meta_schedule.thread_extent_high_inclusive")
            if low is not None and high is not None:
                # ThreadExtentChecker: the innermost threadIdx.x/y/z bound here, multiplied.
                bound = {}
                for _, info in self.nest:
                    if info.tag.startswith("threadIdx"):
                        bound[info.tag] = info.key
                self.thread_checks.append((list(bound.values()), int(low), int(high)))
            for buffer in stmt.alloc_buffers:
                self.alloc_at[buffer.name] = (len(self.nest), _scope(buffer))
            if stmt.init is not None:
                self.visit(stmt.init)
            self.visit(stmt.body)
            for buffer in stmt.alloc_buffers:
                self.handle_alloc(buffer)
        elif t == "BufferStore":
            self.visit_store(stmt)
        elif t == "IfThenElse":
            self.visit(stmt.then_case)
            if stmt.else_case is not None:
                self.visit(stmt.else_case)
        elif t in ("AttrStmt", "LetStmt", "DeclBuffer") and hasattr(stmt, "body"):
            self.visit(stmt.body)

    def visit_for(self, loop: Any) -> None:

        extent = loop.extent
        if tir.node_type(extent) == "IntImm" and int(extent.value) == 0:
            return
        kind = int(loop.kind)
        unit = (
            tir.node_type(loop.min) == "IntImm"
            and int(loop.min.value) == 0
            and tir.node_type(extent) == "IntImm"
            and int(extent.value) == 1
            and kind == 0
            and len(loop.annotations) == 0
        )
        if unit:
            # SimplifyForFeatureExtraction: the loop disappears, its variable becomes 0.
            self.analyzer.bind(loop.loop_var, loop.min, True)
            self.unit_vars.append((loop.loop_var, 0))
            self.visit(loop.body)
            self.unit_vars.pop()
            return
        if tir.node_type(extent) != "IntImm":
            raise ValueError(f"loop {loop.loop_var.name} has a non-constant extent")
        key = self.leaf(self.loop_key(loop), int(extent.value))
        names = {0: "serial", 1: "parallel", 2: "vectorized", 3: "unrolled", 4: "thread"}
        info = Loop(key=key, kind=names.get(kind, "serial"))
        if info.kind == "thread":
            tag = loop.thread_binding.thread_tag
            if tag.startswith("vthread"):
                info.tag = "vthread"
            elif tag in _THREAD_TAGS:
                info.tag = tag
            else:
                raise ValueError(f"unable to recognize thread tag {tag}")
            self.thread_loops.append((self.kernel() or key, info.tag, key))
        unroll = loop.annotations.get("pragma_auto_unroll_max_step")
        if unroll is not None and int(unroll) > 0:
            info.unroll_key = self.leaf(f"U:{key}", int(unroll))
        stages = loop.annotations.get("software_pipeline_stage")
        if stages is not None:
            self.pipelines.append((key, [int(v) for v in stages], *_pipeline_body(loop)))
        self.nest.append((loop, info))
        self.visit(loop.body)
        self.nest.pop()

    def var_info(self, var: Any) -> tuple[int, int] | None:
        """(level, min) of a loop variable of the nest, (−1, min) of a removed unit loop's."""
        for level, (loop, _) in enumerate(self.nest):
            if loop.loop_var.same_as(var):
                if tir.node_type(loop.min) != "IntImm":
                    return None
                return level, int(loop.min.value)
        for unit, low in self.unit_vars:
            if unit.same_as(var):
                return -1, low
        return None

    def derive_regions(
        self,
        skey: str,
        b: str,
        indices: list[list[Any]],
        shapes: list[list[int]],
        stored_shape: list[str],
        buffer: Any = None,
    ) -> str:
        """Derivations of buffer ``b``'s region leaves where the index expression allows and
        they reproduce the analyzer at every level; returns the signature part.

        A divisor equal to the product of the stored buffer's dimensions after ``d`` is that
        product: a copy's fused index ``F // (s₂ · s₃)`` (its shape moves with the tiles,
        halos included, so the product fits no closed form of its own).

        With ``buffer`` (read here, allocated in an enclosing block), a dimension of its shape
        is derived too where it is this read's region over the loops
        ``CompactBufferAllocation`` sizes it by: those inside the allocation, and the thread
        loops around it that the buffer's scope spans (``_relaxed``). A shared cache's shape
        is a sum of tile terms there (a halo), no closed form of the decisions."""
        import tvm_ffi

        n = len(self.nest)
        if not indices or n == 0:
            return ""
        first = indices[0]
        if any(
            not all(tvm_ffi.structural_equal(x, y) for x, y in zip(other, first, strict=True))
            for other in indices[1:]
        ):
            return "?" * len(first)  # several different regions: their union is fitted
        extents = [int(loop.extent.value) for loop, _ in self.nest]
        loop_keys = [info.key for _, info in self.nest]
        parts = []
        for d, expr in enumerate(first):
            form = parse_region(expr, self.var_info)
            if form is None or any(form.extent(i, extents) != shapes[i][d] for i in range(n)):
                parts.append("?")
                continue
            parts.append(form.shape(loop_keys))
            base = f"X:{skey}:{b}:{d}"
            keyed = []
            for q, term in enumerate(form.terms):
                if term.linear:
                    m, o, dv = 1.0, 0.0, 1.0
                else:
                    m = self.leaf(f"{base}:{q}:m", term.mult)
                    o = self.leaf(f"{base}:{q}:o", term.offset)
                    dv = self.leaf(f"{base}:{q}:d", term.divisor)
                    suffix = stored_shape[d + 1 :]
                    if len(stored_shape) == len(first) and suffix and term.divisor > 1:
                        if math.prod(self.values[k] for k in suffix) == term.divisor:
                            self.derived[dv] = Quotient(list(suffix), [])
                            parts[-1] += f"/{q}"
                coefs = {
                    level: (self.leaf(f"{base}:{q}:{loop_keys[level]}", abs(c)), c > 0)
                    for level, c in term.coefs.items()
                }
                keyed.append((m, o, dv, coefs))

            def derivation(is_open: Any, keyed: list = keyed) -> Derivation:
                terms = []
                for m, o, dv, coefs in keyed:
                    pos = [
                        (k, loop_keys[lv]) for lv, (k, up) in coefs.items() if is_open(lv) and up
                    ]
                    neg = [
                        (k, loop_keys[lv])
                        for lv, (k, up) in coefs.items()
                        if is_open(lv) and not up
                    ]
                    if pos or neg:
                        terms.append((m, o, dv, pos, neg))
                return Derivation(terms)

            for i in range(n):
                self.derived[f"N:{skey}:{b}:{loop_keys[i]}:{d}"] = derivation(
                    lambda lv, i=i: lv >= i
                )
            if buffer is not None and b in self.alloc_at:
                depth, scope = self.alloc_at[b]
                relaxed = {
                    lv for lv in range(n) if lv >= depth or _relaxed(scope, self.nest[lv][1].tag)
                }
                shape_key = self.buffer_shape_keys(buffer)[d]
                found = derivation(relaxed.__contains__)
                if (
                    shape_key not in self.derived
                    and form.extent(relaxed.__contains__, extents) == self.values[shape_key]
                    and not any(k in self.derived for k in inputs(found))
                ):
                    self.derived[shape_key] = found
                    parts[-1] += "B"
        return "|".join(parts)

    def derive_quotients(self, store: Any) -> None:
        """Loop extents above this store that are a ceiling division (``regions.ceil_split``):
        the stored buffer's elements over the inner loops' extents. Derived where they divide
        too: a thread count that divides the elements and one that does not are then one case,
        and a case with too few neighbours to fit ``N / D`` on still gets it right."""
        extents = [int(loop.extent.value) for loop, _ in self.nest]
        shape_keys = self.buffer_shape_keys(store.buffer)
        numel = math.prod(self.values[key] for key in shape_keys)
        for outer, inner in ceil_split(list(store.indices), self.var_info, extents).items():
            divisor = math.prod(extents[level] for level in inner)
            info = self.nest[outer][1]
            if info.key in self.derived:
                continue
            if -(-numel // divisor) == extents[outer]:
                info.quotient = True
                self.derived[info.key] = Quotient(
                    list(shape_keys), [self.nest[level][1].key for level in inner]
                )

    def kernel(self) -> str:
        """The key of the outermost thread-bound loop around this point ("" if none)."""
        return next((info.key for _, info in self.nest if info.kind == "thread"), "")

    def handle_alloc(self, buffer: Any) -> None:
        self.allocs[buffer.name] = (
            self.buffer_shape_keys(buffer),
            [info.key for _, info in self.nest],
            _bytes(buffer),
        )
        self.allocations.append(
            (buffer.name, self.buffer_shape_keys(buffer), _bytes(buffer), _scope(buffer))
        )
        self.alloc_kernels.append(self.kernel())

    def visit_store(self, store: Any) -> None:
        import tvm

        value = store.value
        if tir.node_type(value) in ("IntImm", "FloatImm"):
            return
        name = store.buffer.name
        k = self.store_counts.get(name, 0)
        self.store_counts[name] = k + 1
        skey = f"{name}#{k}"
        loops = [info for _, info in self.nest]
        n = len(loops)

        # Init: buffers touched, access type, multi-indices (first-seen order).
        order: list[str] = [name]
        buffers = {name: store.buffer}
        access = {name: 1}
        indices: dict[str, list[list[Any]]] = {name: [list(store.indices)]}

        arith, loads = scan_value(value)
        for buffer, load_indices in loads:
            b = buffer.name
            if b not in access:
                order.append(b)
                buffers[b] = buffer
                access[b] = 0
                indices[b] = []
            elif access[b] == 1:
                access[b] = 2
            if access[b] != 2:
                indices[b].append(load_indices)

        # Region: bind every loop to its min, then open them from inner to outer.
        for loop, _ in self.nest:
            self.analyzer.bind(loop.loop_var, loop.min, True)
        numel_keys: dict[str, list[tuple[str, ...]]] = {b: [()] * n for b in order}
        shapes: dict[str, list[list[int]]] = {b: [[]] * n for b in order}
        shape0: dict[str, list[int]] = {b: [1] * len(buffers[b].shape) for b in order}
        for i in range(n - 1, -1, -1):
            loop, info = self.nest[i]
            self.analyzer.bind(
                loop.loop_var, tvm.ir.Range.from_min_extent(loop.min, loop.extent), True
            )
            for b in order:
                numel, shape = 1, []
                for dim in range(len(buffers[b].shape)):
                    lo, hi = None, None
                    for idx in indices[b]:
                        bound = self.analyzer.const_int_bound(idx[dim])
                        lo = bound.min_value if lo is None else min(lo, bound.min_value)
                        hi = bound.max_value if hi is None else max(hi, bound.max_value)
                    extent = (hi - lo + 1) if indices[b] else 0
                    shape.append(extent)
                    numel *= extent
                if not indices[b]:
                    numel = 1
                    shape = []
                # One leaf per dimension: halos make each dimension affine in the tiles, and
                # their product is then no single closed form.
                dims = tuple(
                    self.leaf(f"N:{skey}:{b}:{info.key}:{d}", e) for d, e in enumerate(shape)
                )
                numel_keys[b][i] = dims
                shapes[b][i] = shape
                self.touched.setdefault(info.key, {}).setdefault(b, []).append(dims)
                if i == 0:
                    shape0[b] = shape
        stored_shape = self.buffer_shape_keys(store.buffer)
        forms = {
            b: self.derive_regions(
                skey, b, indices[b], shapes[b], stored_shape, buffers[b] if access[b] == 0 else None
            )
            for b in order
        }
        self.derive_quotients(store)
        for b in order:
            self.buffer_bytes[b] = _bytes(buffers[b])

        accesses = []
        for b in order:
            buf = buffers[b]
            nbytes = _bytes(buf)
            bshape = _shape(buf)
            shape_keys = self.buffer_shape_keys(buf)
            ndim = len(bshape)
            strides = [1] * ndim
            for d in range(ndim - 2, -1, -1):
                strides[d] = strides[d + 1] * bshape[d + 1]
            cont_key = ""
            if n > 0:
                for d in range(ndim - 1, -1, -1):
                    if shape0[b][d] == bshape[d]:
                        cont_key = shape_keys[d]
                        break
            stride, level, where, dim = 0, -1, "-", ndim
            coefs = [[_coefficients(e) for e in idx] for idx in indices[b]]
            for i in range(n - 1, -1, -1):
                var = self.nest[i][0].loop_var.__chandle__()
                best, dims = None, []
                for idx in coefs:
                    for d in range(ndim - 1, -1, -1):
                        coef = idx[d].get(var, 0)
                        if coef != 0:
                            s = abs(coef) * strides[d]
                            best = s if best is None else min(best, s)
                            dims.append(d)
                            break
                if best is not None and best != 0:
                    stride, level = best, i
                    where = f"{self.nest[i][1].key}:{','.join(map(str, dims))}"
                    dim = dims[0] if len(set(dims)) == 1 else ndim
                    break
            # Keyed by the loop and dimensions it comes from: one meaning across the cases, so
            # that it fits sketch-wide. Where one dimension carries it, the stride is split into
            # the coefficient times the later dimensions' shape leaves: a cache buffer's shape
            # moves with the tiles (halos), and a product of halos is no single closed form.
            if dim < ndim:
                coef = stride // strides[dim]
                stride_keys = (
                    self.leaf(f"S:{skey}:{b}:{where}", coef),
                    *shape_keys[dim + 1 :],
                )
            else:
                stride_keys = (self.leaf(f"S:{skey}:{b}:{where}", stride),)

            region_vars = {v for idx in coefs for e in idx for v in e}
            acc = Access(
                buffer=b,
                dtype_bytes=nbytes,
                access_type=access[b],
                numel_keys=numel_keys[b],
                stride_level=level,
                stride_keys=stride_keys,
                continuous_dim_key=cont_key,
                reuse_type=2,
                reuse_level=-1,
                region_form=forms[b],
            )
            for i in range(n - 1, -1, -1):
                if self.nest[i][0].loop_var.__chandle__() not in region_vars:
                    acc.reuse_type, acc.reuse_level = 0, i
                    if i == n - 1:
                        acc.distance_const = float(sum(self.buffer_bytes[x] for x in order))
                    else:
                        under = self.touched[loops[i + 1].key]
                        acc.distance_terms = [
                            (key, self.buffer_bytes[x]) for x, keys in under.items() for key in keys
                        ]
                    break
                touched = self.touched[loops[i].key][b]
                if len(touched) >= 2:
                    acc.reuse_type, acc.reuse_level = 1, i
                    acc.serial_touched = list(touched)
                    under = self.touched[loops[i].key]
                    acc.distance_terms = [
                        (key, self.buffer_bytes[x]) for x, keys in under.items() for key in keys
                    ]
                    break
            accesses.append(acc)

        if name not in self.stores:
            self.first_order.append(name)  # slots keep first-store order; the last store wins
        self.stores[name] = Store(
            buffer=name,
            loops=loops,
            arith=arith,
            accesses=accesses,
            alloc_shape_keys=None,
            alloc_loop_keys=[],
        )


def _buffer_uses(stmt: Any, stores: set[str], loads: set[str]) -> None:
    t = tir.node_type(stmt)
    if t == "BufferStore":
        stores.add(stmt.buffer.name)
        exprs = [*stmt.indices, stmt.value]
    elif t == "IfThenElse":
        exprs = [stmt.condition]
    else:
        exprs = []

    def on(e: Any) -> None:
        if tir.node_type(e) in tir.LOADS:
            loads.add(tir.load_buffer(e).name)
        for c in tir.children(e):
            on(c)

    for e in exprs:
        on(e)
    if t == "SeqStmt":
        for c in stmt.seq:
            _buffer_uses(c, stores, loads)
    for attr in ("body", "block", "then_case", "else_case"):
        child = getattr(stmt, attr, None)
        if child is not None and tir.node_type(child) not in ("Var", "IntImm", "PrimFunc"):
            _buffer_uses(child, stores, loads)


def _pipeline_body(loop: Any) -> tuple[int, dict[str, int]]:
    """(number of children, versions per buffer allocated in the pipeline) as
    ``InjectSoftwarePipeline`` splits a pipelined loop's body: a block's body, its SeqStmt's
    children, a nested block with a SeqStmt body flattened into its children. A buffer written
    at stage w and read up to stage r is kept in r − w + 1 versions (multi-buffering)."""
    body, allocs = loop.body, []
    if tir.node_type(body) == "SBlockRealize":
        allocs = [b.name for b in body.block.alloc_buffers]
        body = body.block.body
    if tir.node_type(body) != "SeqStmt":
        return 1, {}
    children = []
    for child in body.seq:
        if tir.node_type(child) == "SBlockRealize" and tir.node_type(child.block.body) == "SeqStmt":
            allocs += [b.name for b in child.block.alloc_buffers]
            children += list(child.block.body.seq)
        else:
            children.append(child)
    stages = [int(v) for v in loop.annotations["software_pipeline_stage"]]
    versions: dict[str, int] = {}
    if len(stages) != len(children):
        return len(children), versions  # the pass fails: no versions to speak of
    uses = []
    for child in children:
        stores: set[str] = set()
        loads: set[str] = set()
        _buffer_uses(child, stores, loads)
        uses.append((stores, loads))
    for name in allocs:
        writers = [stages[i] for i, (st, _) in enumerate(uses) if name in st]
        readers = [stages[i] for i, (_, ld) in enumerate(uses) if name in ld]
        if writers and readers:
            versions[name] = max(1, max(readers) - min(writers) + 1)
    return len(children), versions


def _first_store(stmt: Any) -> str | None:
    t = tir.node_type(stmt)
    if t == "BufferStore":
        return stmt.buffer.name
    for attr in ("body", "block", "then_case", "else_case", "init"):
        child = getattr(stmt, attr, None) if t != "Evaluate" else None
        if child is not None and not isinstance(child, (int, str)) and hasattr(child, "same_as"):
            if tir.node_type(child) in ("Var", "IntImm"):
                continue
            found = _first_store(child)
            if found:
                return found
    if t == "SeqStmt":
        for s in stmt.seq:
            found = _first_store(s)
            if found:
                return found
    return None


def extract_program(mod: Any, is_gpu: bool = False, lowered: bool = False) -> Program:
    """The case and the leaf values of a scheduled IRModule (``sch.mod``)."""
    if not lowered:
        mod = lower_for_features(mod)
    collector = _Collector(is_gpu)
    for _, func in mod.functions.items():
        if tir.node_type(func) != "PrimFunc":
            continue
        collector.visit(func.body)
        for param in func.params:
            if hasattr(param, "shape") and hasattr(param, "dtype") and hasattr(param, "name"):
                try:
                    collector.handle_alloc(param)
                except AttributeError:
                    pass
    stores = []
    for name in collector.first_order:
        store = collector.stores[name]
        if name in collector.allocs:
            shape_keys, loop_keys, nbytes = collector.allocs[name]
            store.alloc_shape_keys = shape_keys
            store.alloc_loop_keys = loop_keys
            store.alloc_dtype_bytes = nbytes
        stores.append(store)
    return Program(
        stores=stores,
        is_gpu=is_gpu,
        values=collector.values,
        allocations=collector.allocations,
        thread_checks=collector.thread_checks,
        thread_loops=collector.thread_loops,
        alloc_kernels=collector.alloc_kernels,
        pipelines=collector.pipelines,
        derived=collector.derived,
    )
