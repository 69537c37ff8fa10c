"""GPU validity as differentiable constraints g(x) ≤ 0 (Felix §3.4), mirroring exactly what
MetaSchedule's ``VerifyGPUCode`` postprocessor checks in TVM 0.27
(``src/s_tir/meta_schedule/postproc/verify_gpu_code.cc`` + ``src/s_tir/analysis/
verify_gpu_code.cc``):

1. ``ThreadExtentChecker`` on the scheduled (unlowered) IR: at every block MultiLevelTiling
   annotated with ``meta_schedule.thread_extent_{low,high}_inclusive`` (low = the target's
   ``thread_warp_size``, high = ``max_threads_per_block``), the product of the innermost
   enclosing threadIdx.x/y/z extents must lie in [low, high]. This is what rejects most random
   tilings of small workloads: their thread tile is below 32 (a warp).
2. The function is lowered (the postproc's own pass list, ``verify_lowering``); a pass that
   throws rejects the point.
3. ``GPUCodeVerifier`` with only four limits set — ``max_shared_memory_per_block`` and
   ``max_threads_per_block`` from the target, ``max_vthread`` = 8 and ``max_vector_bytes`` = 16
   hard-coded; everything else (local memory, per-dimension thread limits, kernel count) is
   INT64_MAX, i.e. unchecked. Per kernel (a top-level thread-extent attribute): Π of the
   distinct threadIdx.x/y/z extents ≤ max_threads_per_block; a threadIdx tag bound twice
   with different extents is an error; Σ shared allocations (bytes) ≤ the limit; every
   vector-typed load/store/cast/allocation ≤ 16 bytes. The vthread checks never fire on
   MetaSchedule programs: ``InjectVirtualThread`` removes the vthread attributes before the
   verifier runs and names its loops ``<loop var>.s``, never ``vthread.s``.

The target must define ``max_shared_memory_per_block`` and ``max_threads_per_block``
(``thread_warp_size`` defaults to 32): MetaSchedule raises without them. A ``VerifyGPUCode``
postproc that was never initialized with a TuneContext (``ms.postproc.VerifyGPUCode()``
applied directly) rejects *every* schedule: its warp size is −1, the checker's
``ICHECK(thread_warp_size > 0)`` throws inside a try, and the throw reads as "invalid".

Each g is in log2 space, where products of tile factors are linear in the exponent
variables: where violated its gradient is exact and non-zero. ``gpu_verdict`` evaluates the
same constraints exactly (integers) at a program's own leaves; ``tvm_gpu_errors`` is a port of
the TVM side that names the check TVM fails, for diagnosis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from gradtune.errors import GradtuneError
from gradtune.symbolic import tir
from gradtune.symbolic.program import Program

MAX_VTHREAD = 8  # hard-coded by the postproc; never reached in practice (module docstring)
MAX_VECTOR_BYTES = 16  # hard-coded by the postproc
_THREAD_IDX = ("threadIdx.x", "threadIdx.y", "threadIdx.z")


@dataclass(frozen=True)
class GpuLimits:
    max_threads_per_block: int
    max_shared_memory_per_block: int
    thread_warp_size: int


def gpu_limits(target: Any) -> GpuLimits:
    """The limits VerifyGPUCode reads from the target (it raises if one is missing; so do we)."""
    attrs = target.attrs
    missing = [
        k for k in ("max_threads_per_block", "max_shared_memory_per_block") if k not in attrs
    ]
    if missing:
        raise GradtuneError(
            f"CUDA target lacks {', '.join(missing)}: MetaSchedule's VerifyGPUCode needs them"
        )
    return GpuLimits(
        int(attrs["max_threads_per_block"]),
        int(attrs["max_shared_memory_per_block"]),
        int(attrs.get("thread_warp_size", 32)),
    )


# -- the constraints over a program's leaves ----------------------------------------------------


@dataclass
class Constraint:
    """Σ coef · Π leaves[keys] (over ``terms``) compared with ``bound``.

    sense "le": value ≤ bound; "ge": value ≥ bound; "eq": the products of terms[0] and
    terms[1] are equal (a threadIdx tag bound twice in one kernel)."""

    name: str
    sense: str
    terms: list[tuple[float, tuple[str, ...]]]
    bound: float = 0.0
    # A structural violation of this case (the verdict is "invalid" whatever the values); g
    # still measures how far the leaves are from leaving the case, for a gradient.
    always: bool = False


def gpu_constraints(program: Program, target: Any) -> list[Constraint]:
    """The checks VerifyGPUCode makes on this program's case (structure only, no values)."""
    lim = gpu_limits(target)
    out: list[Constraint] = []
    for i, (keys, low, high) in enumerate(program.thread_checks):
        # ThreadExtentChecker: the annotated range (low is the warp size, high the block limit).
        out.append(Constraint(f"thread_extent_low_{i}", "ge", [(1.0, tuple(keys))], low))
        out.append(Constraint(f"thread_extent_high_{i}", "le", [(1.0, tuple(keys))], high))
    kernels: dict[str, dict[str, list[str]]] = {}
    for kernel, tag, key in program.thread_loops:
        tags = kernels.setdefault(kernel, {})
        if tag in _THREAD_IDX and key not in tags.setdefault(tag, []):
            tags[tag].append(key)
    for kernel, tags in kernels.items():
        firsts = tuple(keys[0] for keys in tags.values())
        if firsts:
            out.append(
                Constraint(
                    f"threads_per_block@{kernel}",
                    "le",
                    [(1.0, firsts)],
                    lim.max_threads_per_block,
                )
            )
        for tag, keys in tags.items():
            for other in keys[1:]:
                out.append(
                    Constraint(
                        f"{tag}_mismatch@{kernel}:{other}",
                        "eq",
                        [(1.0, (keys[0],)), (1.0, (other,))],
                    )
                )
    # Software pipelining keeps a buffer written at stage w and read up to stage r in r − w + 1
    # copies: the verifier sees the multiplied allocation.
    versions: dict[str, int] = {}
    for key, stages, children, copies in program.pipelines:
        versions.update(copies)
        if children != len(stages):
            # InjectSoftwarePipeline throws (stage annotation of the wrong length), which the
            # postproc reads as "invalid". It happens when the pipelined loop has extent 1: the
            # reduction's init then lands inside its body as an extra child. 2 ≤ extent pulls out.
            out.append(Constraint(f"pipeline_body@{key}", "ge", [(1.0, (key,))], 2, always=True))
    shared: dict[str, list[tuple[float, tuple[str, ...]]]] = {}
    for (name, keys, nbytes, scope), kernel in zip(
        program.allocations, program.alloc_kernels, strict=True
    ):
        # Only allocations inside a kernel count: the verifier resets its sums on kernel entry.
        if kernel and scope.split(".")[0] == "shared":
            copies = float(nbytes * versions.get(name, 1))
            shared.setdefault(kernel, []).append((copies, tuple(keys)))
    for kernel, terms in shared.items():
        out.append(
            Constraint(f"shared_memory@{kernel}", "le", terms, lim.max_shared_memory_per_block)
        )
    seen: set[str] = set()
    for store in program.stores:
        for lp in store.loops:
            if lp.kind == "vectorized" and lp.key not in seen:
                seen.add(lp.key)
                width = max((a.dtype_bytes for a in store.accesses), default=4)
                out.append(
                    Constraint(
                        f"vector_bytes@{lp.key}", "le", [(width, (lp.key,))], MAX_VECTOR_BYTES
                    )
                )
    return out


def _log2_value(c: Constraint, leaves: dict[str, torch.Tensor], like: torch.Tensor, term=None):
    terms = c.terms if term is None else [c.terms[term]]
    if len(terms) == 1:
        # A single product: a sum of logs, linear in the exponent variables.
        coef, keys = terms[0]
        out = like + math.log2(coef)
        for k in keys:
            out = out + torch.log2(leaves[k].clamp(min=1e-9))
        return out
    total = like
    for coef, keys in terms:
        prod = like + coef
        for k in keys:
            prod = prod * leaves[k].clamp(min=0)
        total = total + prod
    return torch.log2(total.clamp(min=1e-9))


def constraint_values(
    program: Program, leaves: dict[str, torch.Tensor], target: Any
) -> dict[str, torch.Tensor]:
    """name → g (batch,), in log2 space; the point satisfies the constraint when g ≤ 0."""
    like = next(iter(leaves.values())).to(torch.float64) * 0
    out: dict[str, torch.Tensor] = {}
    for c in gpu_constraints(program, target):
        if c.sense == "le":
            out[c.name] = _log2_value(c, leaves, like) - math.log2(c.bound)
        elif c.sense == "ge":
            out[c.name] = math.log2(c.bound) - _log2_value(c, leaves, like)
            if c.always:
                # Never satisfied inside this case: keep g > 0 even past the bound.
                out[c.name] = torch.nn.functional.softplus(out[c.name]) + 1e-3
        else:
            # Equality as |log a − log b| ≤ 0: violated points get a gradient pulling them level.
            out[c.name] = (_log2_value(c, leaves, like, 0) - _log2_value(c, leaves, like, 1)).abs()
    return out


def gpu_penalties(program: Program, leaves: dict[str, torch.Tensor], target: Any) -> torch.Tensor:
    """Σ relu(g)² over the GPU constraints of ``program``'s case (batch,), differentiable in
    whatever ``leaves`` were built from (``SymbolicSketch.leaves(program, log_f, cats)``)."""
    values = constraint_values(program, leaves, target)
    like = next(iter(leaves.values())).to(torch.float64) * 0
    return sum((torch.relu(g) ** 2 for g in values.values()), like)


def gpu_verdict(
    program: Program, target: Any, values: dict[str, int] | None = None
) -> tuple[bool, list[str]]:
    """(valid, violated constraint names) at integer leaf ``values`` (default: the program's
    own), computed exactly in integers — the verdict VerifyGPUCode gives."""
    values = program.values if values is None else values
    violated = []
    for c in gpu_constraints(program, target):
        sums = [coef * math.prod(int(values[k]) for k in keys) for coef, keys in c.terms]
        if c.sense == "le":
            bad = sum(sums) > c.bound
        elif c.sense == "ge":
            bad = sum(sums) < c.bound
        else:
            bad = sums[0] != sums[1]
        if bad or c.always:
            violated.append(c.name)
    return not violated, violated


# -- TVM's side, ported: which check a schedule fails --------------------------------------------


def verify_lowering(mod: Any, target: Any) -> Any:
    """The pass list VerifyGPUCode lowers each PrimFunc with before verifying it."""
    import tvm
    from tvm import s_tir, tirx

    passes = [
        s_tir.transform.LowerCrossThreadReduction(),
        s_tir.transform.LowerInitBlock(),
        s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
        s_tir.transform.ConvertBlocksToOpaque(),
        s_tir.transform.LiftThreadBinding(),
        s_tir.transform.ManifestSharedMemoryLocalStage(),
        s_tir.transform.CompactBufferAllocation(),
        tirx.transform.StmtSimplify(),
        s_tir.transform.LowerAutoCopy(),
        s_tir.transform.UnifyThreadBinding(),
        s_tir.transform.LowerMatchBuffer(),
        s_tir.transform.InjectSoftwarePipeline(),
        s_tir.transform.LowerOpaqueBlock(),
        tirx.transform.FlattenBuffer(),
        tirx.transform.BF16ComputeLegalize(),
        tirx.transform.NarrowDataType(32),
        tirx.transform.StmtSimplify(),
        tirx.transform.VectorizeLoop(True),
        s_tir.transform.InjectVirtualThread(),
        s_tir.transform.InjectDoubleBuffer(),
        tirx.transform.StorageRewrite(),
        s_tir.transform.MergeSharedMemoryAllocations(),
        tirx.transform.LowerIntrin(),
    ]
    funcs = {}
    for gv, func in mod.functions.items():
        if tir.node_type(func) == "PrimFunc":
            f = func.with_attr("global_symbol", gv.name_hint).with_attr("target", target)
            funcs[gv.name_hint] = f.with_attr("tirx.noalias", True)
    return tvm.transform.Sequential(passes)(tvm.IRModule(funcs))


def _thread_extent_errors(stmt: Any, warp: int) -> list[str]:
    """``ThreadExtentChecker`` on the scheduled IR."""
    errors: list[str] = []

    def visit(s: Any, ext: dict[str, int]) -> None:
        t = tir.node_type(s)
        if t == "For":
            if s.thread_binding is not None and s.thread_binding.thread_tag in _THREAD_IDX:
                ext = {**ext, s.thread_binding.thread_tag: int(s.extent.value)}
            visit(s.body, ext)
        elif t == "SBlockRealize":
            visit(s.block, ext)
        elif t == "SBlock":
            if "warp_execution" in s.annotations:
                ext = {**ext, "threadIdx.x": warp}
            low = s.annotations.get("meta_schedule.thread_extent_low_inclusive")
            high = s.annotations.get("meta_schedule.thread_extent_high_inclusive")
            if low is not None and high is not None:
                product = math.prod(ext.values())
                if not int(low) <= product <= int(high):
                    errors.append(
                        f"thread extent {product} of {s.name_hint} not in [{low}, {high}]"
                    )
            if s.init is not None:
                visit(s.init, ext)
            visit(s.body, ext)
        elif t == "SeqStmt":
            for c in s.seq:
                visit(c, ext)
        elif t == "IfThenElse":
            visit(s.then_case, ext)
            if s.else_case is not None:
                visit(s.else_case, ext)
        elif hasattr(s, "body"):
            visit(s.body, ext)

    visit(stmt, {})
    return errors


def _dtype(node: Any) -> Any:
    import tvm

    # Expressions carry a PrimType ``ty`` in 0.27 (printed like "float32x4").
    return tvm.runtime.DataType(str(node.ty if hasattr(node, "ty") else node.dtype))


def _vector_bytes(node: Any) -> int:
    dt = _dtype(node)
    return (dt.bits * dt.lanes + 7) // 8 if dt.lanes > 1 else 0


class _Verifier:
    """``GPUCodeVerifier`` with MetaSchedule's four limits, on the lowered IR."""

    def __init__(self, lim: GpuLimits) -> None:
        self.lim = lim
        self.errors: list[str] = []
        self.nest = 0
        self.reset()

    def reset(self) -> None:
        self.shared = 0
        self.threads = 1
        self.visited: dict[str, int] = {}

    def expr(self, e: Any) -> None:
        t = tir.node_type(e)
        if t in (*tir.LOADS, "Cast") and _vector_bytes(e) > MAX_VECTOR_BYTES:
            self.errors.append(f"vector {t} of {_vector_bytes(e)} bytes")
        if t in tir.LOADS and _vector_bytes(e):
            self.ramps(e.indices)
        for c in tir.children(e):
            self.expr(c)

    def ramps(self, indices: Any) -> None:
        for index in indices:
            if tir.node_type(index) == "Ramp" and not (
                tir.node_type(index.stride) == "IntImm" and int(index.stride.value) == 1
            ):
                if _vector_bytes(index) > MAX_VECTOR_BYTES:
                    self.errors.append(f"strided ramp of {_vector_bytes(index)} bytes")

    def stmt(self, s: Any) -> None:
        t = tir.node_type(s)
        if t == "AttrStmt" and s.attr_key in ("thread_extent", "virtual_thread"):
            self.attr(s)
        elif t == "AllocBuffer":
            buf = s.buffer
            size = math.prod(int(d.value) if tir.node_type(d) == "IntImm" else 0 for d in buf.shape)
            dt = tvm_dtype(buf)
            nbytes = size * ((dt.bits * dt.lanes + 7) // 8)
            if str(buf.scope()).split(".")[0] == "shared":
                self.shared += nbytes
            if dt.lanes > 1 and (dt.bits * dt.lanes + 7) // 8 > MAX_VECTOR_BYTES:
                self.errors.append(f"vector allocation {buf.name}")
        elif t == "For":
            if s.loop_var.name == "vthread.s" and int(s.extent.value) > MAX_VTHREAD:
                self.errors.append(f"vthreads {int(s.extent.value)} > {MAX_VTHREAD}")
            self.expr(s.min)
            self.expr(s.extent)
            self.stmt(s.body)
        elif t == "SeqStmt":
            for c in s.seq:
                self.stmt(c)
        elif t == "BufferStore":
            if _vector_bytes(s.value) > MAX_VECTOR_BYTES:
                self.errors.append(f"vector store of {_vector_bytes(s.value)} bytes")
            if _vector_bytes(s.value):
                self.ramps(s.indices)
            for i in s.indices:
                self.expr(i)
            self.expr(s.value)
        elif t == "IfThenElse":
            self.expr(s.condition)
            self.stmt(s.then_case)
            if s.else_case is not None:
                self.stmt(s.else_case)
        elif t in ("LetStmt", "Evaluate"):
            self.expr(s.value)
        elif t == "AttrStmt":
            self.stmt(s.body)
        elif hasattr(s, "body"):
            self.stmt(s.body)

    def attr(self, s: Any) -> None:
        if self.nest == 0:
            self.reset()
        name = s.node.var.name
        extent = int(s.value.value)
        if name in (*_THREAD_IDX, "vthread"):
            if name not in self.visited:
                self.visited[name] = extent
                self.threads *= extent
                if name == "vthread" and extent > MAX_VTHREAD:
                    self.errors.append(f"vthread {extent} > {MAX_VTHREAD}")
            elif name != "vthread" and extent != self.visited[name]:
                self.errors.append(f"{name} extent {extent} != {self.visited[name]}")
        self.nest += 1
        self.stmt(s.body)
        self.nest -= 1
        if self.nest == 0:
            if self.threads > self.lim.max_threads_per_block:
                self.errors.append(f"threads per block {self.threads}")
            if self.shared > self.lim.max_shared_memory_per_block:
                self.errors.append(f"shared memory per block {self.shared}")


def tvm_dtype(buffer: Any) -> Any:
    import tvm

    return tvm.runtime.DataType(str(buffer.dtype))


def tvm_gpu_errors(mod: Any, target: Any) -> list[str]:
    """The checks VerifyGPUCode fails on a scheduled module (``sch.mod``), in words; [] when
    it passes. A port for diagnosis: tests compare its verdict with the postproc's."""
    lim = gpu_limits(target)
    errors: list[str] = []
    for _, func in mod.functions.items():
        if tir.node_type(func) == "PrimFunc":
            errors += _thread_extent_errors(func.body, lim.thread_warp_size)
    if errors:
        return errors
    try:
        lowered = verify_lowering(mod, target)
    except Exception as err:  # the postproc catches every lowering error as "invalid"
        return [f"lowering failed: {str(err).strip().splitlines()[-1][:200]}"]
    for _, func in lowered.functions.items():
        verifier = _Verifier(lim)
        verifier.stmt(func.body)
        errors += verifier.errors
    return errors
