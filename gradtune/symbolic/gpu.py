"""GPU validity as differentiable constraints g(x) ≤ 0 (Felix §3.4), mirroring what
MetaSchedule's ``VerifyGPUCode`` postprocessor checks in TVM 0.27:

- threads per block: at every block MetaSchedule annotated with a thread-extent range (its
  ``ThreadExtentChecker``), low ≤ Π threadIdx extents ≤ high — random tilings of small
  workloads mostly fall below the 32-thread floor, which is why nearly every random decision
  is rejected;
- Π threadIdx extents ≤ ``max_threads_per_block`` and Π vthread extents ≤ 8 (``max_vthread``);
- shared memory per block ≤ ``max_shared_memory_per_block``;
- vectorized accesses ≤ 16 bytes (``max_vector_bytes``).

Each g is in log2 space, where products of tile factors are linear in the exponent
variables: its gradient is exact and never vanishes. ``verdict`` evaluates the same
constraints on the leaves' integer values.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from gradtune.symbolic.program import Program

MAX_VTHREAD = 8
MAX_VECTOR_BYTES = 16


def limits(target: Any) -> dict[str, int]:
    attrs = target.attrs
    return {
        "max_threads_per_block": int(attrs.get("max_threads_per_block", 1024)),
        "max_shared_memory_per_block": int(attrs.get("max_shared_memory_per_block", 49152)),
    }


def _log2_prod(keys: list[str], leaves: dict[str, torch.Tensor], like: torch.Tensor):
    out = torch.zeros_like(like)
    for k in keys:
        out = out + torch.log2(leaves[k].clamp(min=1e-9))
    return out


def constraints(
    program: Program, leaves: dict[str, torch.Tensor], target: Any
) -> dict[str, torch.Tensor]:
    """name → g (batch,), satisfied when ≤ 0."""
    lim = limits(target)
    like = next(iter(leaves.values())).to(torch.float64) * 0
    out: dict[str, torch.Tensor] = {}
    for i, (keys, low, high) in enumerate(program.thread_checks):
        threads = _log2_prod(keys, leaves, like)
        out[f"threads_low_{i}"] = math.log2(max(low, 1)) - threads
        out[f"threads_high_{i}"] = threads - math.log2(min(high, lim["max_threads_per_block"]))
    for i, store in enumerate(program.stores):
        threads = [lp.key for lp in store.loops if lp.tag.startswith("threadIdx")]
        if threads:
            out[f"threads_max_{i}"] = _log2_prod(threads, leaves, like) - math.log2(
                lim["max_threads_per_block"]
            )
        vthreads = [lp.key for lp in store.loops if lp.tag == "vthread"]
        if vthreads:
            out[f"vthread_{i}"] = _log2_prod(vthreads, leaves, like) - math.log2(MAX_VTHREAD)
        for lp in store.loops:
            if lp.kind == "vectorized":
                width = max((a.dtype_bytes for a in store.accesses), default=4)
                out[f"vector_{i}_{lp.key}"] = torch.log2(leaves[lp.key] * width) - math.log2(
                    MAX_VECTOR_BYTES
                )
    shared = [
        (keys, nbytes)
        for _, keys, nbytes, scope in program.allocations
        if scope.startswith("shared")
    ]
    if shared:
        total = sum(torch.exp2(_log2_prod(keys, leaves, like)) * nbytes for keys, nbytes in shared)
        out["shared_memory"] = torch.log2(total) - math.log2(lim["max_shared_memory_per_block"])
    return out


def penalty(program: Program, leaves: dict[str, torch.Tensor], target: Any) -> torch.Tensor:
    """Σ relu(g)² over the GPU constraints (batch,)."""
    values = constraints(program, leaves, target)
    like = next(iter(leaves.values())).to(torch.float64) * 0
    return sum((torch.relu(g) ** 2 for g in values.values()), like)


def verdict(program: Program, target: Any) -> tuple[bool, list[str]]:
    """The constraints at the program's own integer leaves: (valid, violated names)."""
    leaves = {k: torch.tensor([float(v)], dtype=torch.float64) for k, v in program.values.items()}
    violated = [n for n, g in constraints(program, leaves, target).items() if float(g[0]) > 1e-9]
    return not violated, violated
