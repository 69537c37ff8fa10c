"""The dataset's workloads: the model zoo's tuning tasks, deduplicated, in collection order.

A workload is one distinct fused PrimFunc of the zoo (several models and batch sizes can share
it); its key is the structural hash the JSONDatabase files it under. ``prioritize`` fixes the
order the collection visits them in, so a capped or interrupted collection is still balanced.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..partition import OPERATOR_FAMILIES, OTHER_FAMILY, operator_family


@dataclass
class WorkloadInfo:
    """One distinct workload of the zoo (deduplicated by structural hash)."""

    key: str  # str(tvm_ffi.structural_hash(mod)): also the JSONDatabase's workload hash
    mod: Any = field(repr=False)
    kernel_class: str
    flops: float
    models: list[str] = field(default_factory=list)  # zoo model names
    instances: dict[str, str] = field(default_factory=dict)  # "model@bN" → task name
    weights: dict[str, int] = field(default_factory=dict)  # "model@bN" → calls per inference


@dataclass
class WorkloadProgress:
    """How far the collection got with one workload (kept across runs in the manifest)."""

    valid: int = 0
    failed: int = 0
    first_error: str = ""
    exhausted: bool = False  # the design space ran out of new programs


def extract_workloads(
    entries: list[Any], target: Any, on_model: Callable[[str, int], None] | None = None
) -> list[WorkloadInfo]:
    """Import every (model, batch) of the zoo, extract its tasks and deduplicate them."""
    import tvm_ffi

    from ..partition import EXACT_LOWERING, extract, prepare
    from ..zoo import import_model, model_tag

    by_key: dict[str, WorkloadInfo] = {}
    for entry in entries:
        for batch in entry.batches:
            mod, params = import_model(entry.model, batch)
            tag = model_tag(entry.model, batch)
            # The lowering the dataset was measured in: another would make workloads its records
            # never cover (re-collecting it with fast math is open work).
            for task in extract(prepare(mod, params, target, EXACT_LOWERING), target):
                key = str(tvm_ffi.structural_hash(task.mod))
                info = by_key.get(key)
                if info is None:
                    info = by_key[key] = WorkloadInfo(key, task.mod, task.kernel_class, task.flops)
                if entry.model not in info.models:
                    info.models.append(entry.model)
                info.instances[tag] = task.name
                info.weights[tag] = info.weights.get(tag, 0) + task.weight
            if on_model is not None:
                on_model(entry.model, batch)
    return list(by_key.values())


def prioritize(workloads: list[WorkloadInfo]) -> list[WorkloadInfo]:
    """Round-robin over operator families, largest FLOPs first within each.

    A collection capped at N workloads (or cut short) then covers every compute family the zoo
    has — convolutions would otherwise crowd out softmax and norms — and the heaviest, most
    schedule-sensitive kernels of each come first.
    """
    by_family: dict[str, list[WorkloadInfo]] = {}
    for info in sorted(workloads, key=lambda w: (-w.flops, w.key)):
        by_family.setdefault(operator_family(info.kernel_class), []).append(info)
    order = [f for f in OPERATOR_FAMILIES if f in by_family]
    out: list[WorkloadInfo] = []
    while any(by_family.get(f) for f in order):
        for f in order:
            if by_family.get(f):
                out.append(by_family[f].pop(0))
    # Elementwise / data-movement kernels last: their design spaces hold a handful of programs
    # (an unroll choice), so they cannot reach the per-workload goal and teach little.
    return out + by_family.get(OTHER_FAMILY, [])
