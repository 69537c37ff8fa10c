"""Finished runs carried from one machine (or session) to the next, small enough for git.

A 480 s benchmark of three models takes hours, longer than a working session, and the work
dir is not kept between sessions. ``--archive DIR`` writes what the analysis and the timing
need from every finished run; ``--restore DIR`` puts it back, so the same command resumes
where the archived runs stopped instead of rerunning them::

    DIR/<budget>s[-config]/runs/<model>/<run id>/result.json
    DIR/<budget>s[-config]/runs/<model>/<run id>/db_at_<percent>/   best record per workload
    DIR/<budget>s[-config]/timing/<model>.json

A run's database holds every measured candidate (megabytes); the library built at ¼, ½ and
all of the budget depends only on each workload's fastest record by then, because the
compiler (``MetaScheduleApplyDatabase``) asks the database for its top-1 record per
workload. The archive keeps exactly that record, chosen by TVM's own ``get_top_k``, so a
restored run rebuilds the same libraries. Rebuilt libraries are verified against the model's
reference outputs, like the originals.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from searchbench import api
from searchbench.layout import Layout
from searchbench.models import MODELS

WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"


def _json_database(folder: Path) -> Any:
    from tvm.s_tir import meta_schedule as ms

    return ms.database.JSONDatabase(
        path_workload=str(folder / WORKLOAD_FILE),
        path_tuning_record=str(folder / RECORD_FILE),
        allow_missing=True,
        module_equality="structural",
    )


def best_records(source: Path, dest: Path) -> int:
    """Copy each workload's fastest valid record of the database in ``source`` to a new
    database in ``dest``; returns how many records it holds."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in (WORKLOAD_FILE, RECORD_FILE):
        (dest / name).unlink(missing_ok=True)
    db = _json_database(source)
    out = _json_database(dest)
    import tvm_ffi

    workloads = {}
    for record in db.get_all_tuning_records():
        workloads.setdefault(tvm_ffi.structural_hash(record.workload.mod), record.workload)
    kept = 0
    for workload in workloads.values():
        for record in db.get_top_k(workload, 1):
            out.commit_tuning_record(
                type(record)(
                    record.trace, out.commit_workload(workload.mod), record.run_secs,
                    record.target, record.args_info,
                )
            )  # fmt: skip
            kept += 1
    return kept


def _finished_runs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.glob("runs/*/*/result.json"))


def archive(layout: Layout, dest: Path) -> int:
    """Write every finished run of ``layout`` to ``dest``; returns how many were archived."""
    target_root = dest / layout.root.name
    count = 0
    for run_dir in _finished_runs(layout.root):
        out = target_root / run_dir.relative_to(layout.root)
        out.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(run_dir / "result.json", out / "result.json")
        for db in sorted(run_dir.glob("db_at_*")):
            if (db / RECORD_FILE).is_file():
                best_records(db, out / db.name)
        count += 1
    timing = layout.root / "timing"
    if timing.is_dir():
        shutil.copytree(timing, target_root / "timing", dirs_exist_ok=True)
    print(f"archived {count} finished runs of {layout.root.name} to {target_root}", flush=True)
    return count


def restore(layout: Layout, source: Path) -> int:
    """Put the archived runs of ``layout``'s configuration back and rebuild their libraries;
    runs already in the work dir are left alone. Returns how many were restored."""
    archived = source / layout.root.name
    if not archived.is_dir():
        raise SystemExit(f"search_efficiency: no archived runs of {layout.root.name} in {source}")
    config, target = api.host_target()
    # A restored run's libraries are rebuilt for this host: schedules tuned on another CPU,
    # compiled and timed here beside this CPU's own runs, would be a comparison of neither.
    runs = {d: json.loads((d / "result.json").read_text()) for d in _finished_runs(archived)}
    for run_dir, result in runs.items():
        tuned_for = result.get("target")
        if tuned_for is not None and tuned_for != config:
            raise SystemExit(
                f"search_efficiency: {run_dir.relative_to(source)} was tuned for "
                f"{json.dumps(tuned_for)}, this host is {json.dumps(config)}: not restored"
            )
    count = 0
    for run_dir, result in runs.items():
        local = layout.root / run_dir.relative_to(archived)
        if (local / "result.json").is_file():
            continue
        shutil.copytree(run_dir, local, dirs_exist_ok=True)
        _rebuild(layout.work, local, result, target)
        count += 1
        print(f"{result['model']} {result['run_id']}: restored", flush=True)
    timing = archived / "timing"
    if timing.is_dir():
        shutil.copytree(timing, layout.root / "timing", dirs_exist_ok=True)
    print(f"restored {count} runs of {layout.root.name} from {archived}", flush=True)
    return count


_imported: dict[str, tuple[Any, Any]] = {}


def _rebuild(work: Path, run_dir: Path, result: dict[str, Any], target: Any) -> None:
    from gradtune.partition import prepare

    libraries = {k: b for k, b in result.get("builds", {}).items() if "library" in b}
    if not libraries:
        return  # a run that failed before its first build: nothing to import the model for
    model = result["model"]
    if model not in _imported:
        imported = api.import_model(MODELS[model].tuning_file(work))
        _imported[model] = (imported, prepare(imported.mod, imported.params, target))
    imported, fused = _imported[model]
    for label, build in libraries.items():
        database = api.open_database(run_dir / f"db_at_{label}")
        api.build_verify_export(imported, fused, target, database, run_dir / build["library"])
