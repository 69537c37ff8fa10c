"""Where one searcher's kernels beat the other's: per task, every run's best program at the
budget, with the two loop decisions that decide most of a small CPU kernel's speed.

- **vec**: the extent of the vectorized innermost loop. A vector register holds 8 (AVX2) or 16
  (AVX-512) fp32 lanes, so an extent of 10 or 20 leaves a masked or scalar remainder that an
  extent of 16 does not; the features both cost models read give the extent (``vectorize_len``)
  but not whether it fills whole registers.
- **par**: the extent of the parallel loop, 1 when the kernel runs on one thread. A kernel of a
  few µs can lose more to waking the thread pool than it gains from the second core.

    .venv/bin/python bench/search_efficiency.py --budget 480 --kernels bert_block

reads the runs of ``--work`` (restore archived ones first) and prints one markdown table: the
tasks ordered by how many µs per inference the evolutionary runs' median best saves over the
gradient runs' (weight × kernel µs), each run's best as ``µs vec/par``.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from gradtune.search.structural import vec_and_par
from searchbench import api
from searchbench.layout import Layout
from searchbench.models import MODELS


def best_programs(database_dir: Path) -> dict[str, dict[str, Any]]:
    """Per workload (structural hash): the fastest record's median µs and loop extents."""
    import tvm
    import tvm_ffi

    best: dict[str, dict[str, Any]] = {}
    for record in api.open_database(database_dir).get_all_tuning_records():
        secs = [float(s) for s in record.run_secs or []]
        if not secs:
            continue
        key = str(tvm_ffi.structural_hash(record.workload.mod))
        us = statistics.median(secs) * 1e6
        if key in best and best[key]["us"] <= us:
            continue
        sch = tvm.s_tir.Schedule(record.workload.mod)
        record.trace.apply_to_schedule(sch, remove_postproc=False)
        vec, par = vec_and_par(sch.mod)
        best[key] = {"us": us, "vec": vec, "par": par}
    return best


def table(layout: Layout, model: str) -> str:
    """The markdown table described in the module docstring, for ``model``'s finished runs."""
    runs = [r for r in layout.results(model) if "error" not in r]
    if not runs:
        raise SystemExit(f"search_efficiency: no finished runs of {model} in {layout.root}")
    _config, target = api.host_target()
    imported = api.import_model(MODELS[model].tuning_file(layout.work))
    _fused, tasks = api.partition_model(imported, target)
    runs.sort(key=lambda r: (r["searcher"], r["repeat"]))
    folder = layout.root / "runs" / model
    programs = {r["run_id"]: best_programs(folder / r["run_id"] / "db_at_100") for r in runs}

    def median_total(task: Any, searcher: str) -> float:
        key = api.workload_key(task)
        found = [
            programs[r["run_id"]][key]["us"]
            for r in runs
            if r["searcher"] == searcher and key in programs[r["run_id"]]
        ]
        return task.weight * statistics.median(found) if found else float("nan")

    rows = []
    for task in tasks:
        saved = median_total(task, "gradient") - median_total(task, "evolutionary")
        cells = []
        for r in runs:
            p = programs[r["run_id"]].get(api.workload_key(task))
            cells.append(f"{p['us']:.1f} {p['vec']}/{p['par']}" if p else "–")
        rows.append((saved, task, cells))
    rows.sort(key=lambda row: -row[0] if row[0] == row[0] else float("inf"))
    header = ["task", "weight", "untuned µs", "evo saves µs", *[r["run_id"] for r in runs]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for saved, task, cells in rows:
        lead = [task.name, str(task.weight), f"{task.untuned_us:.1f}", f"{saved:+.1f}"]
        lines.append("| " + " | ".join(lead + cells) + " |")
    note = (
        f"{model}, budget {layout.budget:g} s: each run's best kernel at the budget as "
        "`µs vec/par` (vectorized innermost extent / parallel extent); 'evo saves' = weight × "
        "(gradient median − evolutionary median) µs per inference."
    )
    return note + "\n\n" + "\n".join(lines)
