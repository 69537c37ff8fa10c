"""What the dataset says about itself: its manifest, its summary and its card.

``manifest.json`` describes the whole database (per workload: models, kernel class, FLOPs,
record and failure counts; the target, hardware and measurement settings) and carries what a
resumed collection needs that the records do not hold (failures, exhausted design spaces).
``dataset_summary`` reads counts and latency spreads from the files without TVM; ``write_card``
turns it into ``README.md`` with a plot, regenerated after every workload of a collection.
"""

from __future__ import annotations

import datetime
import json
import math
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..errors import GradtuneError
from ..partition import operator_family
from . import hardware
from .machines import MACHINES, MANIFEST, load_record_machines
from .settings import CollectSettings
from .store import RECORDS, WORKLOADS, read_lines
from .workloads import WorkloadInfo, WorkloadProgress

CARD = "README.md"
FORMAT = "gradtune-dataset/1"


# --------------------------------------------------------------------------- manifest


def utc_now() -> str:
    """The current UTC time as ISO 8601 to the second, as the manifest records times."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def write_manifest(
    data_dir: Path,
    workloads: list[WorkloadInfo],
    progress: dict[str, WorkloadProgress],
    target_config: dict[str, Any],
    settings: CollectSettings,
    started: str,
    seconds: float,  # collection time so far, earlier runs included
    machine: dict[str, Any],
) -> dict[str, Any]:
    """Write ``manifest.json`` (atomically) for ``workloads`` and return it; its creation time
    survives from an earlier run.

    ``hardware`` is ``machine``, the descriptor of the session writing it (``hardware.describe``):
    the machine the latest records come from. Which machine measured each record is
    ``record_machines.json``'s business, not the manifest's."""
    import tvm

    from ..measure.runner import MeasureSettings

    path = data_dir / MANIFEST
    old = json.loads(path.read_text()) if path.is_file() else {}
    measure = asdict(
        MeasureSettings(
            number=settings.number,
            repeat=settings.repeat,
            min_repeat_ms=settings.min_repeat_ms,
            server_wait_sec=settings.server_wait_sec,
        )
    )
    manifest = {
        "format": FORMAT,
        "target": target_config,
        "hardware": machine,
        "tvm_version": tvm.__version__,
        "measurement": {
            **measure,
            "runner": "MetaSchedule RPCRunner over a local TVM RPC tracker",
            "tvm_threads": machine.get("tvm_threads"),
            "rpc_servers": settings.rpc_servers,
            "builder": "LocalBuilder with gradtune's fast_build",
            "builder_workers": settings.builder_workers,
            "build_timeout_sec": settings.build_timeout_sec,
            "latency": "run_secs holds `repeat` means of `number` runs each",
        },
        "sampling": {
            "random_per_workload": settings.random_per_workload,
            "evolutionary_per_workload": settings.evolutionary_per_workload,
            "batch_size": settings.batch_size,
            "seed": settings.seed,
            "failures": "not stored as records; counted per workload below",
        },
        "created": old.get("created", started),
        "updated": utc_now(),
        "collection_seconds": round(seconds, 1),
        "workloads": {},
    }
    for info in workloads:
        state = progress.get(info.key, WorkloadProgress())
        manifest["workloads"][info.key] = {
            "models": info.models,
            "instances": info.instances,
            "weights": info.weights,
            "kernel_class": info.kernel_class,
            "flops": info.flops,
            "records": state.valid,
            "failed": state.failed,
            "first_error": state.first_error,
            "exhausted": state.exhausted,
        }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=False) + "\n")
    os.replace(tmp, path)
    return manifest


def load_manifest(data_dir: Path) -> dict[str, Any]:
    """The dataset's manifest ({} when there is none yet); bad JSON is a one-line error."""
    path = Path(data_dir) / MANIFEST
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise GradtuneError(f"{path} is not valid JSON: {err}") from None


# --------------------------------------------------------------------------- summary + card


def measured_lines(data_dir: Path) -> list[tuple[int, str, float]]:
    """(record line index, workload key, median latency in seconds) of every record line
    that holds a measurement of a known workload (no TVM needed)."""
    workload_lines, _ = read_lines(data_dir, WORKLOADS)
    record_lines, _ = read_lines(data_dir, RECORDS)
    keys = []
    for line in workload_lines:
        try:
            keys.append(str(json.loads(line)[0]))
        except (ValueError, IndexError, TypeError):
            keys.append("")
    out = []
    for i, line in enumerate(record_lines):
        try:
            index, body = json.loads(line)
            secs = sorted(float(s) for s in body[1])
            key = keys[index]
        except (ValueError, IndexError, TypeError):
            continue
        if secs and key:
            out.append((i, key, secs[len(secs) // 2]))
    return out


def latencies_by_workload(data_dir: Path) -> dict[str, list[float]]:
    """Median latency (seconds) of every valid record, per workload key, in file order."""
    out: dict[str, list[float]] = {}
    for _, key, latency in measured_lines(data_dir):
        out.setdefault(key, []).append(latency)
    return out


def machines_summary(data_dir: Path) -> dict[str, dict[str, Any]]:
    """Per machine id (``record_machines.json``, else the manifest's hardware): its records
    and its descriptor. Machines without a record are left out."""
    attribution = load_record_machines(data_dir)
    lines = measured_lines(data_dir)
    owners = attribution.per_line(max((i for i, _, _ in lines), default=-1) + 1)
    out: dict[str, dict[str, Any]] = {}
    for i, _, _ in lines:
        entry = out.setdefault(owners[i], {"records": 0})
        entry["records"] += 1
    for machine, entry in out.items():
        entry["descriptor"] = attribution.descriptor(machine)
    return out


def dataset_summary(data_dir: str | Path) -> dict[str, Any]:
    """Counts and latency statistics of a dataset directory (for ``dataset info`` and the card)."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise GradtuneError(f"dataset directory not found: {data_dir}")
    manifest = load_manifest(data_dir)
    lat = latencies_by_workload(data_dir)
    records = sum(len(v) for v in lat.values())
    if not manifest and not records:
        raise GradtuneError(f"{data_dir}: no dataset here (no manifest.json, no records)")
    entries = manifest.get("workloads", {})
    goal = (manifest.get("sampling", {}).get("random_per_workload", 0)
            + manifest.get("sampling", {}).get("evolutionary_per_workload", 0))  # fmt: skip
    families: dict[str, dict[str, Any]] = {}
    for key, entry in entries.items():
        fam = operator_family(entry.get("kernel_class", "?"))
        f = families.setdefault(fam, {"workloads": 0, "records": 0, "speedups": []})
        f["workloads"] += 1
        f["records"] += len(lat.get(key, []))
        values = lat.get(key, [])
        if len(values) >= 2:
            f["speedups"].append(sorted(values)[len(values) // 2] / min(values))
    return {
        "workloads": len(entries) or len(lat),
        "workloads_with_records": len(lat),
        "workloads_complete": sum(1 for k in entries if goal and len(lat.get(k, [])) >= goal),
        "records": records,
        "failed": sum(int(e.get("failed", 0)) for e in entries.values()),
        "goal_per_workload": goal,
        "models": sorted({m for e in entries.values() for m in e.get("models", [])}),
        "families": {
            name: {
                "workloads": f["workloads"],
                "records": f["records"],
                "median_over_best": round(_median(f["speedups"]), 2) if f["speedups"] else None,
            }
            for name, f in sorted(families.items())
        },
        "target": manifest.get("target"),
        "hardware": manifest.get("hardware"),
        "machines": machines_summary(data_dir),
        "measurement": manifest.get("measurement"),
        "collection_seconds": manifest.get("collection_seconds"),
        "evolutionary": _evolutionary_gain(lat, manifest),
        "updated": manifest.get("updated"),
    }


def _evolutionary_gain(lat: dict[str, list[float]], manifest: dict[str, Any]) -> dict[str, Any]:
    """How much the evolutionary share adds over random sampling, per workload that has both.

    A workload's evolutionary phase starts only once it holds ``random_per_workload`` records,
    so its first that many records (in file order) are the random ones, whatever restarts
    happened in between.
    """
    n_random = int(manifest.get("sampling", {}).get("random_per_workload", 0) or 0)
    ratios, best_is_evo = [], 0
    for values in lat.values():
        if not n_random or len(values) <= n_random:
            continue
        best_random, best_evo = min(values[:n_random]), min(values[n_random:])
        ratios.append(best_random / min(best_random, best_evo))
        best_is_evo += best_evo < best_random
    return {
        "workloads": len(ratios),
        "best_found_by_evolutionary": best_is_evo,
        "median_best_random_over_best": round(_median(ratios), 3) if ratios else None,
        "max_best_random_over_best": round(max(ratios), 3) if ratios else None,
    }


def _median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2] if values else math.nan


def plot_latencies(data_dir: Path, out: Path) -> bool:
    """Per-family distribution of latency / best latency within each workload."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    manifest = load_manifest(data_dir).get("workloads", {})
    lat = latencies_by_workload(data_dir)
    groups: dict[str, list[float]] = {}
    for key, values in lat.items():
        best = min(values)
        fam = operator_family(manifest.get(key, {}).get("kernel_class", ""))
        groups.setdefault(fam, []).extend(v / best for v in values if best > 0)
    if not groups:
        return False
    names = sorted(groups)
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.boxplot([groups[n] for n in names], whis=(5, 95), showfliers=False)
    ax.set_xticks(range(1, len(names) + 1), names, rotation=30, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("latency / best latency of its workload")
    ax.set_title("Spread of measured candidates per operator family (5–95 %)")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return True


def write_card(data_dir: str | Path, manifest: dict[str, Any] | None = None) -> Path:
    """``data/README.md``: what the dataset is, how it was measured, counts, distributions."""
    data_dir = Path(data_dir)
    s = dataset_summary(data_dir)
    has_plot = plot_latencies(data_dir, data_dir / "latency_spread.png")
    m = s.get("measurement") or {}
    hw = hardware.from_manifest(s.get("hardware"), s.get("target"))
    evo = s["evolutionary"]
    sampling = (manifest or load_manifest(data_dir)).get("sampling", {})
    lines = [
        "# gradtune TenSet-style dataset",
        "",
        "Programs sampled from TVM MetaSchedule design spaces of the workloads of gradtune's model",
        "zoo (`configs/zoo.yaml`, `gradtune/zoo.py`: small networks built in code with random",
        "weights), built and measured over TVM RPC on the machines listed below. Generated by",
        "`gradtune dataset collect` from the data itself; do not edit by hand.",
        "",
        "## Contents",
        "",
        "- `database_workload.json.gz`, `database_tuning_record.json.gz`: TVM's JSONDatabase,",
        "  gzip'd (gunzip both and `ms.database.JSONDatabase(...)` reads them; or",
        "  `gradtune.dataset.store.open_dataset('data')`). Every record is a valid measurement.",
        "- `manifest.json`: per workload (key = structural hash) its models and instances,",
        "  kernel class, FLOPs, record and failure counts; the target, hardware and settings.",
        f"- `{MACHINES}`: which machine measured each record (runs of record lines → machine",
        "  id → descriptor: CPU, ISA flags that change code generation, caches, cores, target).",
        "",
        "## How it was measured",
        "",
        f"- Target: `{json.dumps(s.get('target'))}`",
        f"- Hardware of the latest session: {hardware.short(hw)}, {hw.get('memory_gb', '?')} GB",
        f"- Builder: {m.get('builder', '?')}; runner: {m.get('runner', '?')} "
        f"({m.get('rpc_servers', '?')} server); number={m.get('number')}, "
        f"repeat={m.get('repeat')}, min_repeat_ms={m.get('min_repeat_ms')}, "
        f"cache flush {'on' if m.get('enable_cpu_cache_flush') else 'off'}",
        f"- Sampling per workload: {sampling.get('random_per_workload')}"
        " random programs (ReplayTrace over every sketch, random cost model), then up to "
        f"{sampling.get('evolutionary_per_workload')} from a short "
        "EvolutionarySearch (XGBModel trained on the workload's records) so that good programs "
        "are represented. Duplicate programs are not measured twice.",
        "- Failed builds/runs are not stored; they are counted per workload in the manifest.",
        "",
        *_machines_section(s["machines"]),
        "## Counts",
        "",
        f"- {s['workloads']} distinct workloads from {len(s['models'])} models "
        f"({', '.join(s['models'])}); {s['workloads_with_records']} have records, "
        f"{s['workloads_complete']} reached the goal of {s['goal_per_workload']}.",
        f"- {s['records']} measured records; {s['failed']} failed candidates (not stored).",
        f"- Collection time: {((s.get('collection_seconds') or 0) / 3600):.2f} h; last update "
        f"{s.get('updated')}.",
        "",
        "| operator family | workloads | records | median latency / best |",
        "|---|---:|---:|---:|",
    ]
    if evo["workloads"]:
        # Records come in file order, random share first: what the evolutionary share added.
        lines.insert(
            lines.index("## Counts") + 4,
            f"- Evolutionary share: the best program of {evo['best_found_by_evolutionary']} of "
            f"{evo['workloads']} workloads came from it; the best random program is "
            f"{evo['median_best_random_over_best']}× the best latency at the median, "
            f"{evo['max_best_random_over_best']}× at worst.",
        )
    for name, f in s["families"].items():
        lines.append(f"| {name} | {f['workloads']} | {f['records']} | {f['median_over_best']} |")
    lines += [""]
    if has_plot:
        lines += ["![latency spread](latency_spread.png)", ""]
    lines += [
        "The last column is, per workload, the median candidate's latency over the best one's",
        "(medians across the family): how much a good schedule matters there.",
        "",
    ]
    out = data_dir / CARD
    out.write_text("\n".join(lines))
    return out


def _machines_section(machines: dict[str, dict[str, Any]]) -> list[str]:
    lines = [
        "## Machines",
        "",
        "| machine id | records | CPU | ISA flags (codegen) | L1d / L2 / L3 KiB | target |",
        "|---|---:|---|---|---|---|",
    ]
    for machine, entry in sorted(machines.items(), key=lambda kv: -kv[1]["records"]):
        d = entry["descriptor"]
        caches = d.get("caches") or {}
        sizes = " / ".join(str(caches.get(k) or "?") for k in ("l1d_kb", "l2_kb", "l3_kb"))
        isa = "unknown" if d.get("isa") is None else " ".join(d["isa"]) or "none"
        lines.append(
            f"| `{machine}` | {entry['records']} | {d.get('cpu_model') or '?'}, "
            f"{d.get('physical_cores') or '?'} cores | {isa} | {sizes} | "
            f"`{json.dumps(d.get('target'))}` |"
        )
    lines += [
        "",
        "Records collected before per-record machines were stored have no range in",
        f"`{MACHINES}`: they belong to the dataset-level `hardware` entry the manifest had then",
        "(ISA flags and caches unknown). Pretraining trains on the machines that measured for",
        "its target and refuses to mix machines whose ISA flags differ unless told to.",
        "",
    ]
    return lines
