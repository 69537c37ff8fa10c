"""Flow: retune the models whose fingerprint changed, and promote what is correct and no slower.

For each model of the config (``gradtune.retune``): import it and fingerprint it; if the
registered ``champion`` carries the same fingerprint, skip it. Otherwise tune it (the same
stages as ``tune-model``), register the result under the alias ``challenger`` with its
provenance tags (``gradtune.provenance``), then verify it and time it interleaved with the
champion (``gradtune.promotion``) and move ``champion`` to it only if it wins.

Several models run concurrently on Prefect's ``DaskTaskRunner`` (``gradtune.scaleout``): a
local cluster sized so that no two tunings measure on the same cores, or the user's cluster
(``dask_address``). One model, or one worker's worth of cores, runs in the flow's process.

Parameters are flat and typed, so Prefect's UI renders them and a deployment can set them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from gradtune import flow_logging, provenance, retune, scaleout
from gradtune.entrypoints import call_in_module, load_tasks
from gradtune.errors import GradtuneError
from gradtune.job import make_job
from gradtune.promotion import CHALLENGER, CHAMPION
from gradtune.stop import exit_on_signals
from gradtune.threads import use_target_threads
from gradtune.transfer.library import REGISTRY

tuning = load_tasks("tuning", __file__)
steps = load_tasks("retune", __file__)
flow_logging.one_line_user_errors()


@flow(name="retune-on-change", log_prints=False)
def retune_on_change(
    models: list[str] | None = None,
    config: str = "configs/models.yaml",
    target: str = "llvm",
    trials: int = 128,
    time_budget: float | None = None,
    search: str = "gradient",
    mlflow_uri: str | None = None,
    out: str = "runs/retune",
    tracker: str | None = None,
    key: str | None = None,
    rpc_servers: int = 1,
    seed: int = 0,
    measure: str = "fixed",
    dask_address: str | None = None,
    dask_workers: int | None = None,
    warm_start: bool = True,
) -> list[dict[str, Any]]:
    """Retune ``models`` (paths or registered names; default: every model of ``config``)
    whose fingerprint differs from their champion's; one result per model.

    ``dask_address``: the scheduler of an existing Dask cluster (``tcp://host:8786``) to tune
    the models on; None: a local cluster of ``dask_workers`` processes (None: as many as can
    measure without timing each other, ``scaleout.local_workers``).

    ``warm_start``: each tune starts from the schedules of the registry's gradtune models (the
    model's own champion among them) by transfer-tuning; an empty registry tunes cold.
    """
    uri = mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        raise GradtuneError(
            "retune compares with a registered champion: pass --mlflow-uri or set "
            "MLFLOW_TRACKING_URI"
        )
    specs = retune.select(retune.load_config(config), models or [])
    settings = dict(
        trials=trials, time_budget=time_budget, search=search, tracker=tracker, key=key,
        mlflow_uri=uri, alias=CHALLENGER, rpc_servers=rpc_servers, seed=seed, measure=measure,
        library=REGISTRY if warm_start else None,
    )  # fmt: skip
    workers = dask_workers or scaleout.local_workers(
        len(specs), scaleout.target_cores(target), scaleout.remote_devices(tracker, len(specs))
    )
    with exit_on_signals(), flow_logging.to_run_logs():
        if len(specs) > 1 and (dask_address or workers > 1):
            # One registry read first: on a new SQLite store it creates the schema, which
            # workers starting together would otherwise race to migrate.
            steps.aliased(retune.registered_name(specs[0]), CHAMPION, uri)
            runner = scaleout.dask_task_runner(dask_address, workers, scaleout.current_api_url())
            return retune_concurrently.with_options(task_runner=runner)(
                specs, target, out, settings
            )
        return [retune_model(spec, target, out, settings) for spec in specs]


# A Dask worker runs the model's retune by name from this file: the flow module is loaded by
# path (gradtune.entrypoints), so its functions cannot be pickled by reference. A worker lost
# mid-run is rescheduled by Dask on another one; an attempt that raised is retried once and
# resumes from its database (one directory per fingerprint).
retune_remote = task(
    call_in_module,
    name="retune-model",
    cache_policy=NO_CACHE,
    retries=1,
    retry_delay_seconds=10,
)


@flow(name="retune-models-on-dask", log_prints=False)
def retune_concurrently(
    specs: list[retune.ModelSpec], target: str, out: str, settings: dict[str, Any]
) -> list[dict[str, Any]]:
    """Every model as its own task on the flow's task runner; a model that fails is named, and
    the others finish first."""
    futures = [
        retune_remote.with_options(task_run_name=f"retune {spec.path}").submit(
            __file__, "retune_model", spec, target, out, settings
        )
        for spec in specs
    ]
    results, failed = [], []
    for spec, future in zip(specs, futures, strict=True):
        try:
            results.append(future.result())
        except Exception as err:  # noqa: BLE001 - reported per model below
            failed.append(f"{spec.path}: {type(err).__name__}: {err}")
    if failed:
        raise GradtuneError(f"retune could not finish {len(failed)} model(s): " + "; ".join(failed))
    return results


def retune_model(
    spec: retune.ModelSpec, target: str, out: str, settings: dict[str, Any]
) -> dict[str, Any]:
    """One model: skip, or tune → register as challenger → judge → record."""
    logger = get_run_logger()
    name = retune.registered_name(spec)
    uri = settings["mlflow_uri"]
    job = make_job(
        target, model=spec.path, entry=spec.entry, input_shapes=spec.input_shapes, name=name,
        **settings,
    )  # fmt: skip
    use_target_threads(job.target)  # before any kernel runs here or on the local fleet
    imported = tuning.import_model(job)
    fp, parts = steps.fingerprint(imported, job.target)
    champion = steps.aliased(name, CHAMPION, uri)
    result = {"model": spec.path, "name": name, "fingerprint": fp}
    if champion is not None and champion.tags.get(provenance.FINGERPRINT) == fp:
        logger.info("%s unchanged (fingerprint %s = %s@champion)", name, fp, name)
        return {**result, "outcome": "unchanged", "champion_version": champion.version}
    had = (
        f"{name}@champion has {champion.tags.get(provenance.FINGERPRINT)}"
        if champion
        else (f"{name} has no champion")
    )
    logger.info("%s changed (fingerprint %s; %s): retuning", name, fp, had)
    # One directory per fingerprint: an interrupted retune of the same model resumes there.
    job.out, job.resume = str(Path(out) / name / fp), True
    fused, tasks = tuning.partition_model(imported, job.target)
    # With job.library set, the tune stage first measures the library's schedules for these
    # tasks (transfer-tuning), which seed the search: a changed model retunes from its
    # champion's schedules of the kernel classes it kept.
    tuned = tuning.tune_model_tasks(job, tasks, job.target)
    tolerance = {
        key: value
        for key, value in (("rtol", spec.rtol), ("atol_scale", spec.atol_scale))
        if value is not None
    }
    compiled = tuning.compile_model(
        job, imported, fused, job.target, strict=False, with_peers=False, **tolerance
    )
    tags = provenance.version_tags(fp, parts, champion.version if champion else None, spec.path)
    tags.update(tuned_ms=f"{compiled.tuned_ms:.6g}", untuned_ms=f"{compiled.untuned_ms:.6g}")
    if compiled.verify_error:
        tags["verify_error"] = compiled.verify_error[:5000]
    summary = tuning.report_and_register(job, imported, tasks, tuned, compiled, tags)
    challenger = steps.version(name, summary["model_version"], uri)
    decision = steps.judge(
        name, challenger, champion, imported, tuned_error=compiled.verify_error, **tolerance
    )
    steps.record(name, challenger, decision)
    (logger.info if decision.outcome != "rejected" else logger.error)(
        "%s version %s %s: %s", name, challenger.version, decision.outcome, decision.reason
    )
    return {
        **result,
        "outcome": decision.outcome,
        "reason": decision.reason,
        "challenger_version": challenger.version,
        "champion_version": challenger.version
        if decision.promoted
        else (champion.version if champion else None),
        "out": job.out,
    }
