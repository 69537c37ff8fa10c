"""Tuning records → training groups for the cost models, and a dataset → its features file.

A record's trace is replayed on its workload (decisions kept, postprocessors re-run, as
MetaSchedule does before measuring) and featurized twice: gradtune's *symbolic* features in
their smooth form at the record's integer decisions (the function the gradient search
differentiates), and TVM's ``PerStoreFeature`` for the peers. A record that no longer applies
is skipped and counted, never fatal. ``featurize_dataset`` does this for every record of a
dataset and writes the symbolic features to the file pretraining reads (``pretrain.py``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gradtune.dataset.card import load_manifest
from gradtune.dataset.store import Skipped, open_dataset
from gradtune.errors import GradtuneError
from gradtune.partition import module_kernel_class, operator_family
from gradtune.symbolic.features import evaluate
from gradtune.symbolic.program import extract_program
from gradtune.target import is_gpu as target_is_gpu


@dataclass
class WorkloadData:
    """The replayed, measured candidates of one workload."""

    key: str
    mod: Any
    family: str
    context: Any  # TuneContext (target, postprocs), shared with the peers
    schedules: list[Any] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    symbolic: list[torch.Tensor] = field(default_factory=list)


def replay(mod: Any, trace: Any, postprocs: list[Any]) -> Any | None:
    """The record's schedule (decisions as recorded, postprocessors applied), or None."""
    import tvm

    sch = tvm.s_tir.Schedule(mod)
    trace.apply_to_schedule(sch, remove_postproc=True)
    for postproc in postprocs:
        if not postproc.apply(sch):
            return None
    return sch


def symbolic_features(sch: Any, is_gpu: bool = False) -> torch.Tensor:
    """Smooth symbolic features at the schedule's own integer decisions: (stores, 164)."""
    program = extract_program(sch.mod, is_gpu)
    leaves = {k: torch.tensor([float(v)], dtype=torch.float64) for k, v in program.values.items()}
    return evaluate(program, leaves, "smooth")[0].to(torch.float32)


def make_context(mod: Any, target: Any) -> Any:
    from tvm.s_tir import meta_schedule as ms

    from gradtune.tvm_compat import register_tensor_intrinsics

    register_tensor_intrinsics(target.kind.name)
    return ms.TuneContext(
        mod=mod, target=target, space_generator="post-order-apply", task_name="workload"
    )


def from_records(
    records: Iterable[Any],
    target: Any,
    skipped: Skipped | None = None,
    kernel_classes: dict[str, str] | None = None,
    progress=None,
) -> list[WorkloadData]:
    """Group ``ms.database.TuningRecord``s by workload and featurize them.

    ``kernel_classes`` maps workload keys to kernel classes (the manifest's); a workload not
    in it is classified by its block names."""
    import tvm_ffi

    skipped = skipped if skipped is not None else Skipped()
    is_gpu = target_is_gpu(target)
    by_key: dict[str, WorkloadData] = {}
    for record in records:
        if progress is not None:
            progress()
        run_secs = [float(s) for s in (record.run_secs or [])]
        if not run_secs or not all(np.isfinite(run_secs)) or min(run_secs) >= 1e9:
            skipped.add("invalid measurement", "a record without a valid measurement")
            continue
        mod = record.workload.mod
        key = str(tvm_ffi.structural_hash(mod))
        if key not in by_key:
            context = make_context(mod, target)
            # Operator family (conv2d, matmul, ...), not the whole kernel class: per-family
            # metrics need several workloads per row.
            kernel_class = (kernel_classes or {}).get(key) or module_kernel_class(mod)
            family = operator_family(kernel_class)
            by_key[key] = WorkloadData(key, mod, family, context)
        data = by_key[key]
        try:
            sch = replay(mod, record.trace, list(data.context.space_generator.postprocs))
        except Exception as err:  # TVM raises several types when a trace does not apply
            why = str(err).strip().splitlines()[0]
            skipped.add("stale trace", f"a trace that no longer applies ({why})")
            continue
        if sch is None:
            skipped.add("rejected trace", "a trace its postprocessors reject")
            continue
        data.schedules.append(sch)
        data.latencies.append(float(np.median(run_secs)))
        data.symbolic.append(symbolic_features(sch, is_gpu))
    return [d for d in by_key.values() if len(d.latencies) >= 2]


def featurize_dataset(
    data_dir: str | Path, out: str | Path, target_config: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Featurize every record of the dataset ``data_dir`` into the torch file ``out``.

    The file holds the target, counts, and per workload with two or more usable records its
    key, family, zoo models, latencies and symbolic features. It is written whole (never half a
    file where the next stage reads). Returns its summary: records, seconds, skipped (load and
    replay counts, the first reason) and the number of workloads.
    """
    from rich.progress import Progress

    from gradtune.target import make_target

    data_dir, out = Path(data_dir), Path(out)
    if not data_dir.is_dir():
        raise GradtuneError(f"dataset directory not found: {data_dir}")
    manifest = load_manifest(data_dir)
    target_config = target_config or manifest.get("target")
    if not target_config:
        raise GradtuneError(f"{data_dir}: no manifest.json naming the dataset's target")
    load_skipped = Skipped()
    database = open_dataset(data_dir, target=target_config, skipped=load_skipped)
    records = list(database.get_all_tuning_records())
    target = make_target(target_config)
    entries = manifest.get("workloads", {})
    families = {k: v.get("kernel_class", "") for k, v in entries.items()}
    skipped = Skipped()
    start = time.perf_counter()
    with Progress(transient=True) as progress:
        bar = progress.add_task("featurizing records", total=len(records))
        groups = from_records(
            records, target, skipped, families, progress=lambda: progress.advance(bar)
        )
    if not groups:
        raise GradtuneError(f"{data_dir}: no workload with two or more usable records")
    result = {
        "target": target_config,
        "records": sum(len(g.latencies) for g in groups),
        "seconds": round(time.perf_counter() - start, 1),
        "skipped": {
            "load": load_skipped.count,
            "replay": skipped.count,
            "first_reason": load_skipped.first_reason or skipped.first_reason,
        },
        "workloads": [
            {
                "key": g.key,
                "family": g.family,
                "models": entries.get(g.key, {}).get("models", []),
                "latencies": list(g.latencies),
                "programs": g.symbolic,
            }
            for g in groups
        ],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    torch.save(result, partial)
    partial.replace(out)
    summary = {k: result[k] for k in ("records", "seconds", "skipped")}
    return summary | {"workloads": len(result["workloads"])}
