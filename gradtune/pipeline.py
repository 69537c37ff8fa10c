"""The stages of a tuning job as plain functions; ``tasks/tuning.py`` wraps them for Prefect.

import → partition → tune (over RPC) → compile + verify + time → report → register. Prefect
times every task run; the run summary quotes those times (``stage_seconds``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from . import compilation, peers, provenance, registry, report, roofline
from .errors import GradtuneError
from .frontend import ImportedModel, fingerprint, load_model
from .job import TuneJob, mark_out_dir
from .measure.rpc_fleet import LocalFleet, check_tracker, parse_tracker, threads_mismatch
from .measure.runner import MeasureSettings
from .partition import Lowering, TuningTask, partition
from .redact import redact_uri
from .search.session import RoundLog
from .target import is_gpu, make_target
from .task_timing import task_run_seconds
from .threads import runtime_threads, target_threads
from .transfer.library import load_library, write_task_table
from .transfer.run import Transfer, library_spec, library_uri, select_source, source_choice
from .tune import TuneResult, tune

log = logging.getLogger(__name__)
# Rich falls back to 80 columns when piped (CI logs, Prefect workers): too narrow for task names.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)


@dataclass
class CompileResult:
    """Latencies (medians, ms) and errors against the reference of the untuned and tuned
    builds, and the exported library; the peers' latencies (None: the error says why), ONNX
    Runtime's profiled µs per operator type, and the machine's peak (None on a GPU target)."""

    untuned_ms: float
    tuned_ms: float
    reference_ms: float
    max_abs_err: float
    untuned_max_abs_err: float
    lib_path: Path
    peers: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> {ms, error}
    peer_threads: int = 0
    tvm_threads: int = 0  # the size of the pool TVM's runtime ran the timed kernels on
    timing: dict[str, Any] = field(default_factory=dict)  # compilation.Timing.conditions
    ort_op_us: dict[str, float] = field(default_factory=dict)
    peak: dict[str, Any] | None = None
    # Set only by a compile_stage(strict=False) whose tuned build failed verification.
    verify_error: str | None = None


def import_stage(job: TuneJob) -> ImportedModel:
    model = load_model(job.model, job.entry, job.input_shapes)
    console.print(
        f"[bold]imported[/] {job.model} ({model.framework}): "
        f"inputs {[list(x.shape) for x in model.inputs]}, {len(model.params)} weight tensors"
    )
    return model


def partition_stage(
    model: ImportedModel, target_config: dict, lowering: dict[str, bool] | None = None
) -> tuple[Any, list[TuningTask]]:
    """``lowering``: ``partition.Lowering``'s fields (``TuneJob.lowering_options``)."""
    target = make_target(target_config)
    fused, tasks = partition(model.mod, model.params, target, Lowering(**(lowering or {})))
    table = Table(title=f"{len(tasks)} tuning tasks", title_justify="left")
    for col in report.TASK_HEADER:
        table.add_column(col, justify="left" if col in ("task", "kernel class") else "right")
    for row in report.task_table_rows(tasks):
        table.add_row(*row)
    console.print(table)
    log.info("partitioned into %d tasks: %s", len(tasks), ", ".join(t.kernel_class for t in tasks))
    return fused, tasks


@contextlib.contextmanager
def rpc_tracker(job: TuneJob):
    """The user's tracker, or a local fleet started here and stopped on any exit."""
    if job.tracker:
        tracker = parse_tracker(job.tracker, job.key)
        check_tracker(tracker)
        if mismatch := threads_mismatch(tracker, job.target):
            log.warning("%s", mismatch)  # the console and, in a flow, the run's logs
        yield tracker
        return
    with LocalFleet(num_servers=job.rpc_servers) as tracker:
        console.print(
            f"[bold]RPC[/] local fleet: tracker {tracker.host}:{tracker.port}, "
            f"{job.rpc_servers} server(s), key {tracker.key}"
        )
        yield tracker


def tune_stage(job: TuneJob, tasks: list[TuningTask], target_config: dict) -> TuneResult:
    """Tune into ``job.out_dir``. The first stage to write there, so it records the model in
    the directory (``run.json``) here: input that fails to import leaves no directory behind."""
    mark_out_dir(job, fingerprint(job.model, job.entry, job.input_shapes))
    target = make_target(target_config)
    write_task_table(job.out_dir, tasks, job.lowering_options())
    transfer = transfer_from_library(job, tasks, target) if job.library else None
    columns = [
        TextColumn("[bold]tuning[/]"), BarColumn(), MofNCompleteColumn(), TextColumn("trials"),
        TimeElapsedColumn(), TextColumn("{task.fields[status]}"),
    ]  # fmt: skip
    with rpc_tracker(job) as tracker, Progress(*columns, console=console) as progress:
        # A transfer has no trial budget: its bar only runs.
        total = None if job.transfer_only else job.trials
        bar = progress.add_task("tune", total=total, status="starting (MetaSchedule init)")

        resumed = 0

        def on_start(resumed_trials: int) -> None:
            nonlocal resumed
            resumed = resumed_trials
            progress.update(bar, completed=min(job.trials, resumed))

        printed_at = -math.inf

        def on_round(record: RoundLog) -> None:
            nonlocal printed_at
            status = f"kernels ≈ {record.estimated_model_us / 1e3:.3f} ms"
            completed = min(job.trials, resumed + record.trials)
            progress.update(bar, completed=completed, status=status)
            # Without a terminal (CI, nohup, a worker's stdout) rich draws the bar only when it
            # ends: a plain line now and then shows the run is alive and where it stands.
            if not console.is_terminal and record.seconds - printed_at >= PLAIN_PROGRESS_S:
                printed_at = record.seconds
                of = "" if job.transfer_only else f"/{job.trials}"
                console.print(f"tuning: {completed}{of} trials, {record.seconds:.0f} s; {status}")

        result = tune(
            tasks,
            target,
            job.out_dir,
            tracker,
            # A transfer measures what it has; the budget bounds a search.
            max_trials=TRANSFER_TRIALS if job.transfer_only else job.trials,
            time_budget=job.time_budget,
            search=None if job.transfer_only else job.search,
            warm_start=transfer,
            measure=MeasureSettings(mode=job.measure),
            confirm_top_k=job.confirm,
            warmup=job.warmup,
            seed=job.seed,
            on_start=on_start,
            on_round=on_round,
            # Only a registry the user named: the default sqlite store under the job's out dir
            # holds this job's runs, never a pretrained champion.
            tracking_uri=job.mlflow_uri,
        )
    if transfer is not None:
        result.transfer = stats = transfer.stats
        console.print(
            f"[bold]transfer[/] from {stats.source}: {stats.applied} applied, {stats.adapted} "
            f"adapted, {stats.failed} failed; {stats.measured} measured in "
            f"{stats.seconds:.1f} s; faster than the default: {len(stats.transferred_tasks)} "
            f"of {len(tasks)} tasks"
            + ("; the search skips its warm-up" if result.warmup_skipped else "")
        )
    if result.confirmation is not None and result.confirmation.tasks:
        c = result.confirmation
        console.print(
            f"[bold]confirmed[/]: {len(c.tasks)} tasks' fastest programs timed again quietly"
            f" in {c.seconds:.1f} s; {c.changed} ship another program than the recorded best"
        )
    if result.resumed_trials:
        console.print(f"resumed: {result.resumed_trials} trials already in the database were kept")
    log.info(
        "tuned %d trials in %.1f s (%d resumed); kernels ≈ %.3f ms",
        result.trials, result.seconds, result.resumed_trials,
        result.rounds[-1].estimated_model_us / 1e3 if result.rounds else math.nan,
    )  # fmt: skip
    return result


PLAIN_PROGRESS_S = 30.0  # between progress lines when stdout is not a terminal
TRANSFER_TRIALS = 10**6  # no budget: a transfer measures every candidate it has


def transfer_from_library(job: TuneJob, tasks: list[TuningTask], target: Any) -> Transfer:
    """The job's library read, its source chosen by Eq. 1 (or ``--from``), the ranking printed;
    an empty library, or one without the model's kernel classes, leaves a warm start cold with
    a one-line notice."""
    library = load_library(library_spec(job), library_uri(job))
    if library.skipped:
        console.print(f"[yellow]library[/]: {len(library.skipped)} unreadable source(s) skipped")
    source, lines = select_source(
        tasks, library, target, source_choice(job), job.lowering_options()
    )
    # Without a source the last line says why; a warm start says it once, as its notice.
    cold = source is None and not job.transfer_only
    for line in lines[:-1] if cold else lines:
        console.print(line, markup=False)  # kernel classes in [brackets] are not markup
    if cold:
        console.print(f"[yellow]warm start[/]: {escape(lines[-1])}; tuning cold")
    return Transfer(tasks, target, source, ranking=lines)


def compile_stage(
    job: TuneJob,
    model: ImportedModel,
    fused: Any,
    target_config: dict,
    strict: bool = True,
    rtol: float = compilation.RTOL,
    atol_scale: float = compilation.ATOL_SCALE,
    with_peers: bool = True,
) -> CompileResult:
    """Build untuned and tuned, verify both against the reference, time them interleaved with
    the peers (ONNX Runtime, torch.compile, PyTorch eager) on the target's core count; profile
    ONNX Runtime per operator and read the machine's peak for the roofline.

    ``strict=False`` records a tuned build that fails verification (``verify_error``) instead
    of raising: a retune keeps such a challenger as a version that says why it was rejected.
    ``with_peers=False`` times only untuned, tuned and the reference (a retune compares with
    its champion, not with the peers)."""
    from .tune import compile_database

    target = make_target(target_config)
    untuned_exec = compilation.build(fused, target)
    tuned_exec = compilation.build(fused, target, compile_database(job.out_dir))
    untuned = compilation.Runner(untuned_exec, target, model.inputs)
    tuned = compilation.Runner(tuned_exec, target, model.inputs)
    tolerance = {"rtol": rtol, "atol_scale": atol_scale}
    ref = model.reference_outputs
    untuned_outputs, tuned_outputs = untuned.outputs(), tuned.outputs()
    errors, verify_error = {}, None
    for label, outputs in (("untuned TVM", untuned_outputs), ("tuned TVM", tuned_outputs)):
        try:
            errors[label] = compilation.verify(outputs, ref, label, **tolerance)
        except GradtuneError as err:
            if strict:
                raise
            if label == "tuned TVM":  # what is registered; the untuned build is only logged
                verify_error = str(err)
            errors[label] = compilation.max_abs_error(outputs, ref)
            log.warning("%s", err)
    untuned_err, tuned_err = errors["untuned TVM"], errors["tuned TVM"]
    threads = peer_threads(target_config)
    with peers.torch_threads(threads):
        contenders = peers.build_peers(model, threads) if with_peers else peers.Peers([], threads)
        for name, error in contenders.errors().items():
            console.print(f"[yellow]{name} not compared[/]: {error}")
        fns = {"untuned": untuned.run, "tuned": tuned.run, **contenders.runnable()}
        # The reference is the peer of the model's own framework; should that peer have
        # failed, the import's own reference run stands in.
        reference = peers.EAGER if model.framework == "pytorch" else peers.ORT
        pools = {"untuned": "tvm", "tuned": "tvm", **peers.POOLS}
        if reference not in fns:
            pools["reference"] = pools[reference]  # the framework's own runtime
            reference, fns["reference"] = "reference", model.run_reference
        timing = compilation.time_rounds(fns, pools=pools)
        latencies = timing.medians()
        ort_op_us = contenders.ort_op_us()
    log.info(
        "latency ms: untuned %.3f, tuned %.3f, reference %.3f; max abs error %.2g",
        latencies["untuned"], latencies["tuned"], latencies[reference], tuned_err,
    )  # fmt: skip
    lib_path = compilation.export(tuned_exec, job.out_dir / "model.so")
    return CompileResult(
        untuned_ms=latencies["untuned"],
        tuned_ms=latencies["tuned"],
        reference_ms=latencies[reference],
        max_abs_err=tuned_err,
        untuned_max_abs_err=untuned_err,
        lib_path=lib_path,
        peers={p.name: {"ms": latencies.get(p.name), "error": p.error} for p in contenders.peers},
        peer_threads=threads,
        tvm_threads=runtime_threads(),
        timing=timing.conditions(),
        ort_op_us=ort_op_us,
        # The peak is this CPU's: a GPU target's kernels are not measured against it.
        peak=None if is_gpu(target) else roofline.machine_peak(threads),
        verify_error=verify_error,
    )


def peer_threads(target_config: dict) -> int:
    """The thread count every peer runs on: the one TVM's runtime runs the tuned kernels on
    (``threads.target_threads``: the target's ``num-cores`` unless the user chose)."""
    return target_threads(target_config)


def run_summary(
    job: TuneJob,
    model: ImportedModel,
    tasks: list[TuningTask],
    tuned: TuneResult,
    compiled: CompileResult,
    mlflow_uri: str,
) -> dict[str, Any]:
    """What ``summary.json`` records of a tuning run (the registry adds run id and version)."""
    return {
        "model": job.model,
        "framework": model.framework,
        "target": job.target,
        "search": "transfer" if job.transfer_only else job.search,
        # Every field of the gradient search's configuration (None for the other searches).
        "gradient_config": tuned.search_config,
        # The code that tuned it ("-dirty": with uncommitted changes), for results that name it.
        provenance.GRADTUNE_COMMIT: provenance.git_commit(),
        "tasks": len(tasks),
        "trials": tuned.trials,
        "resumed_trials": tuned.resumed_trials,
        "total_trials": tuned.trials + tuned.resumed_trials,
        "tuning_seconds": tuned.seconds,
        "stopped_by_time_budget": tuned.stopped_by_time_budget,
        # This run's measured batches per task: how far past the warm-up the budget went.
        "batches_per_task": dict(Counter(r.task for r in tuned.rounds)),
        "measure": job.measure,
        "warmup": tuned.warmup,  # how the task scheduler's first batches went round
        "lowering": job.lowering_options(),
        "measure_seconds": tuned.measure_cost.seconds,  # device time spent timing candidates
        "kernel_runs": tuned.measure_cost.kernel_runs,
        "measure_unconverged": tuned.measure_cost.unconverged,
        "untuned_ms": compiled.untuned_ms,
        "tuned_ms": compiled.tuned_ms,
        "reference": "PyTorch eager" if model.framework == "pytorch" else "ONNX Runtime",
        "reference_ms": compiled.reference_ms,
        "speedup_vs_untuned": compiled.untuned_ms / compiled.tuned_ms,
        "speedup_vs_reference": compiled.reference_ms / compiled.tuned_ms,
        "max_abs_err": compiled.max_abs_err,
        "verify_error": compiled.verify_error,
        "untuned_max_abs_err": compiled.untuned_max_abs_err,
        "tolerance": {"rtol": compilation.RTOL, "atol_scale": compilation.ATOL_SCALE},
        "registered": f"{registered_model_name(job)}@{job.alias}",
        "mlflow_uri": redact_uri(mlflow_uri),  # shown and stored: never its credentials
        "best_task_us": {k: v for k, v in tuned.best_us.items() if math.isfinite(v)},
        # Tasks that compile their default schedule: nothing searched was faster.
        "default_schedule_tasks": tuned.default_kept,
        # What a user would deploy instead, timed interleaved with the tuned model; ratio =
        # tuned ms / peer ms (below 1: the tuned model is faster).
        "peer_threads": compiled.peer_threads,
        "tvm_threads": compiled.tvm_threads,
        # The cross-core state the medians' rounds ran in, and how many of all (crosscore).
        "timing": compiled.timing,
        "peers": {
            name: {
                "ms": p["ms"],
                "ratio_vs_tuned": compiled.tuned_ms / p["ms"] if p["ms"] else None,
                "error": p["error"],
            }
            for name, p in compiled.peers.items()
        },
        "roofline": roofline.summarize(tasks, tuned.best_us, compiled.peak, compiled.ort_op_us),
        **transfer_summary(job, tuned),
        # The quiet re-timing of each task's few best before compiling (measure.confirm).
        **(tuned.confirmation.summary() if tuned.confirmation is not None else {}),
    }


def transfer_summary(job: TuneJob, tuned: TuneResult) -> dict[str, Any]:
    """What a transfer or warm start adds to ``summary.json`` (nothing for a cold run)."""
    stats = tuned.transfer
    if stats is None:
        return {}
    return {
        "warm_start": not job.transfer_only,
        "source": stats.source,
        "source_ranking": stats.ranking,
        "transferred_tasks": stats.transferred_tasks,
        # Whose warm-up batch the search skipped: each had a measured program already.
        "warmup_skipped": tuned.warmup_skipped,
        "candidates_tried": stats.candidates_tried,
        "candidates_invalid": stats.candidates_invalid,
        "candidates_applied": stats.applied,
        "candidates_adapted": stats.adapted,
        "candidates_failed": stats.failed,
        "transfer_seconds": stats.seconds,
    }


def registered_model_name(job: TuneJob) -> str:
    """``--name``, or ``gradtune-<model file stem>[-<entry>]``."""
    if job.name:
        return job.name
    stem = Path(job.model).stem + ("" if job.entry == "get_model" else f"-{job.entry}")
    return f"gradtune-{stem}".replace("_", "-")


class RegistrationFailed(GradtuneError):
    """The tuned model could not be registered; its files are kept for ``gradtune register``.

    Its own exit code tells a scheduler that the tuning itself succeeded.
    """

    exit_code = 3


def report_and_register_stage(
    job: TuneJob,
    model: ImportedModel,
    tasks: list[TuningTask],
    tuned: TuneResult,
    compiled: CompileResult,
    tags: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Write the report, save what registering takes into the output directory, register.

    ``tags`` are added to the new version's (``gradtune.provenance``)."""
    mlflow_uri = job.mlflow_uri or registry.default_tracking_uri(job.out_dir)
    summary = run_summary(job, model, tasks, tuned, compiled, mlflow_uri)
    files = report.write_report(job.out_dir, summary, tasks, tuned.rounds, tuned.best_us)
    if warning := report.budget_warning(summary):
        log.warning("%s", warning)  # the console and, in a flow, the run's logs
    rounds, search_table = [], []
    for r in tuned.rounds:
        metrics = {
            "trials": r.trials,
            "tuning_seconds": r.seconds,
            "best_kernels_us": r.estimated_model_us,
            "task_best_us": r.task_best_us,
        }
        if r.search is not None:
            metrics.update(
                search_seconds=r.search.search_s,
                descent_seconds=r.search.descent_s,
                explorer_seconds=r.search.explorer_s,
                measure_seconds=r.search.measure_s,
                prediction_spearman=r.search.prediction_spearman,
                predicted_best_score=r.search.predicted_best,
                measured_batch_best_us=r.search.measured_best_us,
                costmodel_finetune_loss=r.search.finetune_loss,
            )
            search_table.append({"task": r.task, "measured": r.measured, **asdict(r.search)})
        rounds.append(metrics)
    if search_table:
        # MLflow metrics are numbers: the per-round table (task names included) is an artifact.
        search_rounds = job.out_dir / "search_rounds.json"
        search_rounds.write_text(json.dumps(search_table, indent=1))
        files = [*files, search_rounds]
    search_params = asdict(tuned.search_summary) if tuned.search_summary is not None else {}
    params = {
        "model": job.model, "entry": job.entry, "framework": model.framework,
        "target": job.target, "search": "transfer" if job.transfer_only else job.search,
        "measure": job.measure, "library": job.library,
        "library_from": job.library_from or (source_choice(job) if job.library else None),
        **job.lowering_options(), "trials_budget": job.trials,
        "time_budget": job.time_budget, "tasks": len(tasks), "seed": job.seed,
        **{f"search_{k}": v for k, v in search_params.items()},
    }  # fmt: skip
    if tuned.search_config is not None:
        params["gradient_config"] = tuned.search_config  # one JSON value: ~30 fields
    finals = {
        k: summary[k]
        for k in ("untuned_ms", "tuned_ms", "reference_ms", "max_abs_err", "tuning_seconds")
    }
    # MLflow's "measure_seconds" is already each round's build + RPC wall time.
    finals.update(
        device_measure_seconds=summary["measure_seconds"], kernel_runs=summary["kernel_runs"]
    )
    out = job.out_dir.resolve()
    registry.Registration(
        registered_name=registered_model_name(job),
        alias=job.alias,
        params=params,
        round_metrics=rounds,
        final_metrics={**finals, "trials": float(tuned.trials)},
        lib=compiled.lib_path.resolve().relative_to(out).as_posix(),
        database_files=[
            p.name for p in sorted([*out.glob("database_*.json"), *out.glob("confirmed*.json")])
        ],
        report_files=[p.resolve().relative_to(out).as_posix() for p in files],
        io=registry.io_description(
            model.input_names, model.inputs, "cuda" if is_gpu(job.target) else "cpu"
        ),
        summary=summary,
        tags=dict(tags or {}),
    ).save(job.out_dir)
    # Read after registering: the stages before this one finished seconds ago, long enough for
    # Prefect to have recorded them.
    return register_run_dir(job.out_dir, job.mlflow_uri, stage_seconds=task_run_seconds)


def register_run_dir(
    out_dir: Path, mlflow_uri: str | None, stage_seconds: Callable[[], dict] | None = None
) -> dict[str, Any]:
    """Register the run saved in ``out_dir`` (``registry.Registration``) at ``mlflow_uri`` (None:
    the sqlite store in ``out_dir``) and write its ``summary.json``; returns the summary.

    The tune's last stage and ``gradtune register OUT_DIR`` both end here. Any failure is one
    ``RegistrationFailed`` line naming the command that registers the kept files later.
    """
    registration = registry.Registration.load(out_dir)
    uri = mlflow_uri or registry.default_tracking_uri(out_dir)
    try:
        info = registry.register(registration, uri, out_dir)
    except Exception as err:
        later = f"gradtune register {out_dir}"
        if mlflow_uri:
            later += f" --mlflow-uri {redact_uri(mlflow_uri)}"
        reason = str(getattr(err, "message", None) or err).strip().splitlines()
        raise RegistrationFailed(
            f"could not register the model in MLflow at {redact_uri(uri)} "
            f"({reason[0] if reason else type(err).__name__}); the compiled model and tuning "
            f"database are kept in {out_dir}; register them later with: {later}"
        ) from err
    summary = {
        **registration.summary,
        "registered": info["registered"],
        "mlflow_uri": redact_uri(uri),  # shown and stored: never its credentials
        "run_id": info["run_id"],
        "model_version": info["version"],
    }
    if stage_seconds is not None:
        summary["stage_seconds"] = stage_seconds()
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def print_summary(summary: dict[str, Any]) -> None:
    table = Table(title="gradtune result", title_justify="left")
    table.add_column("")
    table.add_column("latency (ms)", justify="right")
    table.add_column("speedup vs untuned", justify="right")
    u = summary["untuned_ms"]
    table.add_row("untuned TVM", f"{u:.3f}", "1.00×")
    table.add_row("tuned TVM", f"{summary['tuned_ms']:.3f}", f"{u / summary['tuned_ms']:.2f}×")
    table.add_row(
        summary["reference"],
        f"{summary['reference_ms']:.3f}",
        f"{u / summary['reference_ms']:.2f}×",
    )
    for name, peer in summary.get("peers", {}).items():
        if name != summary["reference"]:
            ms = peer["ms"]
            table.add_row(name, f"{ms:.3f}" if ms else "not run", f"{u / ms:.2f}×" if ms else "")
    console.print(table)
    console.print(
        f"tuned vs {summary['reference']}: {summary['speedup_vs_reference']:.2f}× · "
        f"max abs error {summary['max_abs_err']:.2g} · {summary['total_trials']} trials"
    )
    # Unwrapped: a command broken over two lines cannot be copied and run.
    console.print(
        f"registered [bold]{summary['registered']}[/] in {summary['mlflow_uri']}", soft_wrap=True
    )
    pull = f"gradtune pull {summary['registered']} --out DIR --mlflow-uri {summary['mlflow_uri']}"
    console.print(f"pull it: {pull}", soft_wrap=True)
