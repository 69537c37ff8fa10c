"""Tuning records → training groups for the cost models, and a dataset → its features file.

A record's trace is replayed on its workload (decisions kept, postprocessors re-run, as
MetaSchedule does before measuring) and featurized twice: gradtune's *symbolic* features in
their smooth form at the record's integer decisions (the function the gradient search
differentiates), and TVM's ``PerStoreFeature`` for the peers. A record that no longer applies
is skipped and counted, never fatal. ``featurize_dataset`` does this for every record of a
dataset and writes the symbolic features to the file pretraining reads (``pretrain.py``), one
group per workload and measuring machine: latencies of one program on two CPUs are two facts,
and a ranking within a group must compare like with like.
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
from gradtune.dataset.machines import load_record_machines
from gradtune.dataset.store import Skipped, machine_counts, open_dataset
from gradtune.errors import GradtuneError
from gradtune.measure.latency import median_seconds
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
    machine: str = ""  # id of the machine that measured the latencies (dataset.machines)


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
    machine: str = "",
) -> list[WorkloadData]:
    """Group ``ms.database.TuningRecord``s by workload and featurize them.

    ``kernel_classes`` maps workload keys to kernel classes (the manifest's); a workload not
    in it is classified by its block names. ``machine`` is the id of the machine that
    measured every one of ``records``; the groups carry it."""
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
            by_key[key] = WorkloadData(key, mod, family, context, machine=machine)
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
        data.latencies.append(median_seconds(run_secs))
        data.symbolic.append(symbolic_features(sch, is_gpu))
    return [d for d in by_key.values() if len(d.latencies) >= 2]


def featurize_dataset(
    data_dir: str | Path, out: str | Path, target_config: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Featurize every record of the dataset ``data_dir`` into the torch file ``out``.

    The file holds the target, counts, the descriptor of every machine whose records it holds
    (``machines``, by id), and per workload and machine with two or more usable records its
    key, family, zoo models, machine id, latencies and symbolic features. It is written whole
    (never half a file where the next stage reads). Returns its summary: records, seconds,
    skipped (load and replay counts, the first reason), the number of workloads (groups) and
    the records per machine.
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
    attribution = load_record_machines(data_dir)
    load_skipped = Skipped()
    by_machine = records_by_machine(data_dir, target_config, load_skipped)
    target = make_target(target_config)
    entries = manifest.get("workloads", {})
    families = {k: v.get("kernel_class", "") for k, v in entries.items()}
    skipped = Skipped()
    start = time.perf_counter()
    groups: list[WorkloadData] = []
    with Progress(transient=True) as progress:
        total = sum(len(records) for records in by_machine.values())
        bar = progress.add_task("featurizing records", total=total)
        for machine, records in by_machine.items():
            groups += from_records(
                records, target, skipped, families, lambda: progress.advance(bar), machine
            )
    if not groups:
        raise GradtuneError(f"{data_dir}: no workload with two or more usable records")
    used = sorted({g.machine for g in groups})
    result = {
        "target": target_config,
        "records": sum(len(g.latencies) for g in groups),
        "seconds": round(time.perf_counter() - start, 1),
        "skipped": {
            "load": load_skipped.count,
            "replay": skipped.count,
            "first_reason": load_skipped.first_reason or skipped.first_reason,
        },
        "machines": {m: attribution.descriptor(m) for m in used},
        "workloads": [
            {
                "key": g.key,
                "family": g.family,
                "models": entries.get(g.key, {}).get("models", []),
                "machine": g.machine,
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
    per_machine = {m: sum(len(g.latencies) for g in groups if g.machine == m) for m in used}
    return summary | {"workloads": len(result["workloads"]), "machines": per_machine}


def records_by_machine(
    data_dir: Path, target_config: dict[str, Any], skipped: Skipped
) -> dict[str, list[Any]]:
    """The dataset's usable tuning records for ``target_config``, by the id of the machine
    that measured them; ``skipped`` adds up the bad lines of all of them.

    The dataset is read whole first (a caller's ``open_dataset`` cached the cleaned copy, or
    this call does); measured by more than one machine, it is read again machine by machine:
    TVM's JSONDatabase hands records back ordered by latency, not by line, so a machine is
    chosen while reading, not found afterwards.
    """
    database = open_dataset(data_dir, target=target_config, skipped=skipped)
    counts = machine_counts(data_dir, target_config)  # of the copy open_dataset just cached
    if len(counts) <= 1:
        machine = next(iter(counts), load_record_machines(data_dir).fallback["id"])
        return {machine: list(database.get_all_tuning_records())}
    skipped.count, skipped.reasons, skipped.first_reason = 0, {}, ""  # counted per machine below
    out = {}
    for machine in sorted(counts):
        part = Skipped()
        database = open_dataset(data_dir, target=target_config, skipped=part, machines=[machine])
        out[machine] = list(database.get_all_tuning_records())
        for kind, n in part.reasons.items():
            skipped.add(kind, part.first_reason, n)
    return out
