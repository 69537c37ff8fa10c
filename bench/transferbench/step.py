"""One run of the transfer benchmark (a child process): tune, transfer or warm-start one model,
then build the model as tuned by the budget.

Each kind does what its ``gradtune`` command does, through the same calls the search-efficiency
benchmark makes (``searchbench.run.tune_until_deadline``: the CLI's builder, local RPC fleet,
task scheduler and batch, a timer stopping the search at the budget B):

- ``full`` (= cold): the gradient search with this model's leave-out cost model, budget B;
- ``transfer``: no search; the library's source chosen by Eq. 1 and its schedules measured,
  as ``gradtune transfer`` (``transfer.run.Transfer``, tune's ``warm_start`` hook);
- ``warm``: both: the transfer, then the search for the rest of B.

The clock starts before the library is read: its loading, Eq. 1 and the measurement of the
transferred schedules count toward a transfer's and a warm start's time. Every batch (the
transfer is one) is stamped with its wall-clock time and the model's estimated latency.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

from searchbench import api
from searchbench import run as searchrun
from searchbench.layout import RunSpec
from searchbench.models import MODELS
from searchbench.report import git_commit

from transferbench.layout import FINAL, FULL, TRANSFER, UNTUNED, WARM, TransferLayout

TRANSFER_BUDGET = 24 * 3600.0  # a transfer has no deadline: it measures what it has


def default_lowering() -> dict[str, Any]:
    """The lowering ``api.partition_model`` gives (tune's default): what the partition table
    records as having shaped each loop nest, and what a library's schedules must share."""
    from dataclasses import asdict

    from gradtune.partition import DEFAULT_LOWERING

    return asdict(DEFAULT_LOWERING)


class LibraryTransfer:
    """tune's ``warm_start`` hook that reads the library when called (inside the clock): the
    sources by Eq. 1 (``choice`` "auto"; "all": every source together, ``--from all``), then
    ``transfer.run.Transfer`` from the chosen."""

    def __init__(
        self, tasks: list[Any], target: Any, library: list[Path], choice: str = "auto"
    ) -> None:
        self.tasks, self.target, self.library, self.choice = tasks, target, library, choice
        self.transfer: Any = None

    def __call__(self, database: Any, builder: Any, runner: Any, trials_left: int) -> int:
        from gradtune.transfer.library import load_library
        from gradtune.transfer.run import Transfer, select_source

        library = load_library(",".join(str(d) for d in self.library))
        source, lines = select_source(
            self.tasks, library, self.target, self.choice, default_lowering()
        )
        print("\n".join(lines), flush=True)
        self.transfer = Transfer(self.tasks, self.target, source, ranking=lines)
        return self.transfer(database, builder, runner, trials_left)

    def stats(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self.transfer.stats) if self.transfer is not None else {}


def run(spec: RunSpec, layout: TransferLayout) -> dict[str, Any]:
    """Everything of one run; returns the result that becomes ``result.json``."""
    from gradtune.transfer.library import TASK_TABLE, write_task_table
    from gradtune.tune import estimate_model_us

    prepared = json.loads(layout.prepared(spec.model).read_text())
    config, target = api.host_target()
    run_dir = layout.run_dir(spec)
    started = time.time()
    load_before = os.getloadavg()
    imported = api.import_model(MODELS[spec.model].tuning_file(layout.work))
    fused, tasks = api.partition_model(imported, target)
    db = run_dir / searchrun.DB
    source = search_efficiency_run(spec, layout) if spec.searcher == FULL else None
    if source is not None:
        return adopt(spec, layout, source, tasks)
    db.mkdir(parents=True, exist_ok=True)
    # The partition table names each workload's kernel class: what a library reads.
    write_task_table(db, tasks, default_lowering())
    library = layout.library_dirs(spec.model) if spec.searcher in (TRANSFER, WARM) else []
    if spec.searcher in (TRANSFER, WARM) and not library:
        raise RuntimeError(f"no other model's {FULL} run finished: the library would be empty")
    choice = layout.warm_from if spec.searcher == WARM else "auto"
    hook = LibraryTransfer(tasks, target, library, choice) if library else None
    weights = Path(prepared["weights"])
    if spec.searcher == UNTUNED:
        for name in (searchrun.WORKLOAD_FILE, searchrun.RECORD_FILE):
            (db / name).touch()
        tuned = {"rounds": [], "wall_s": 0.0, "overrun_pct": 0.0, "trials_total": 0}
    else:
        search = spec.searcher != TRANSFER
        with api.local_fleet() as tracker:
            tuned = searchrun.tune_until_deadline(
                RunSpec(spec.model, "gradient", spec.repeat), tasks, target, tracker,
                layout.budget if search else TRANSFER_BUDGET, run_dir, weights,
                gradient=layout.kwargs_of(spec.searcher), warm_start=hook, search=search,
                warmup=layout.warmup if spec.searcher == WARM else None,
            )  # fmt: skip
        if not search:
            tuned["overrun_pct"] = 0.0
    records = searchrun.record_count(run_dir)
    # Only what was measured by the budget counts (a transfer has none: all of it).
    in_budget = records if spec.searcher in (TRANSFER, UNTUNED) else None
    if in_budget is None:
        in_budget = searchrun.records_by(tuned["rounds"], layout.budget)
    build: dict[str, Any] = {"records": in_budget}
    start = time.perf_counter()
    try:
        database = searchrun.shipped_database(run_dir, in_budget, f"db_at_{FINAL}")
        shutil.copyfile(db / TASK_TABLE, database / TASK_TABLE)
        library_file = run_dir / f"model_at_{FINAL}.so"
        build["max_abs_err"] = api.build_verify_export(
            imported, fused, target, api.open_database(database), library_file
        )
        build["library"] = library_file.name
    except Exception as err:  # a wrong schedule or a failed build: recorded, not fatal
        build["error"] = f"{type(err).__name__}: {err}"[:2000]
    build["compile_s"] = round(time.perf_counter() - start, 1)
    # The latency the search reached by the budget, as its measured records estimate it.
    horizon = layout.budget if spec.searcher in (FULL, WARM) else math.inf
    final_us = searchrun.estimate_by(tuned["rounds"], horizon)
    untuned_us = estimate_model_us(tasks, {})
    return {
        "model": spec.model,
        "searcher": spec.searcher,
        "repeat": spec.repeat,
        "seed": spec.repeat,
        "run_id": spec.run_id,
        "budget_s": layout.budget,
        "tasks": len(tasks),
        "target": config,
        "cost_model": str(weights) if spec.searcher in (FULL, WARM) else None,
        # The whole configuration, not only the overrides: defaults move between commits.
        "gradient_config_effective": (
            layout.effective_of(spec.searcher) if spec.searcher in (FULL, WARM) else None
        ),
        "library": [str(d) for d in library],
        "transfer": hook.stats() if hook else None,
        **tuned,
        "untuned_estimated_us": untuned_us,
        "final_estimated_us": final_us if final_us is not None else untuned_us,
        "records_in_db": records,
        "trials_in_budget": in_budget,
        "builds": {FINAL: build},
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "seconds_total": round(time.time() - started, 1),
        "commit": git_commit(),
    }


def search_efficiency_run(spec: RunSpec, layout: TransferLayout) -> Path | None:
    """The search-efficiency benchmark's run that a ``full`` run would repeat, if it finished:
    the gradient search of the same configuration on the same model, budget, seed and
    leave-out cost model, through the same call (``tune_until_deadline``), with the default
    batch and fixed measurement. ``bench/search_efficiency.py`` in the same work dir leaves
    these behind, under the same ``--gradient-config`` or, if it recorded the same effective
    configuration (a default has since moved to what the option names), under none; not a
    run restored from an archive, which has no whole database."""
    from searchbench.layout import Layout

    twin = RunSpec(spec.model, "gradient", spec.repeat)
    names = dict.fromkeys([layout.gradient_config, ""])
    for peer in (Layout(layout.work, layout.budget, name) for name in names):
        if not peer.finished(twin):
            continue
        # A run restored from an archive (searchbench.archive) keeps only each build's best
        # records, not the whole database a library transfers from and a user's run holds.
        if not (peer.run_dir(twin) / searchrun.DB).is_dir():
            continue
        result = json.loads(peer.result(twin).read_text())
        if "error" in result or not result.get("per_round_is_default", True):
            continue
        if "library" not in result.get("builds", {}).get(FINAL, {}):
            continue
        if layout.config_moved(result) is None:
            return peer.run_dir(twin)
    return None


def adopt(spec: RunSpec, layout: TransferLayout, source: Path, tasks: list[Any]) -> dict[str, Any]:
    """A ``full`` run made of the search-efficiency run at ``source``: its database, its build
    at the budget and its result, with the partition table a library reads added."""
    from gradtune.transfer.library import TASK_TABLE, write_task_table
    from gradtune.tune import estimate_model_us

    run_dir = layout.run_dir(spec)
    final = f"db_at_{FINAL}"
    for folder in (searchrun.DB, final):
        if (source / folder).is_dir():
            shutil.copytree(source / folder, run_dir / folder, dirs_exist_ok=True)
    write_task_table(run_dir / searchrun.DB, tasks, default_lowering())
    shutil.copyfile(run_dir / searchrun.DB / TASK_TABLE, run_dir / final / TASK_TABLE)
    result = json.loads((source / "result.json").read_text())
    build = result["builds"][FINAL]
    shutil.copyfile(source / build["library"], run_dir / build["library"])
    print(f"{spec.model} {spec.run_id}: adopted {source} (the same run, already made)", flush=True)
    final_us = searchrun.estimate_by(result["rounds"], layout.budget)
    untuned_us = estimate_model_us(tasks, {})
    return {
        **{k: v for k, v in result.items() if k != "builds"},
        "searcher": spec.searcher,
        "run_id": spec.run_id,
        "library": [],
        "transfer": None,
        "untuned_estimated_us": untuned_us,
        "final_estimated_us": final_us if final_us is not None else untuned_us,
        "builds": {FINAL: build},
        "adopted_from": str(source),
    }
