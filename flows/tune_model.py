"""Flow: tune one model end to end and register it (the CLI's ``gradtune tune``).

Its parameters are ``gradtune.job.TuneJob``'s fields, flat and typed so that Prefect's UI
renders them as a form; ``target`` is text: "llvm" (this CPU), "cuda", or a JSON target object.
``out`` left empty (a deployment's runs) is a fresh ``runs/<model>-<UTC time>`` under the run's
working directory, so that repeated runs never collide.

SIGINT or SIGTERM (a Prefect cancellation is a SIGTERM to the flow run's process) stops the
run within ``gradtune.stop.GRACE_SECONDS``, resumable (``gradtune.stop.exit_on_signals``). It is
installed in the flow's body: Prefect's engine installs its own SIGTERM handler when the run
starts, which raises wherever the main thread is, TVM's callbacks included.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from gradtune import flow_logging
from gradtune.entrypoints import load_tasks
from gradtune.job import fresh_out_dir, make_job
from gradtune.stop import exit_on_signals
from gradtune.threads import use_target_threads

tuning = load_tasks("tuning", __file__)
flow_logging.one_line_user_errors()


@flow(name="tune-model", log_prints=False)
def tune_model(
    model: str,
    entry: str = "get_model",
    input_shapes: dict[str, list[int]] | None = None,
    target: str = "llvm",
    trials: int = 128,
    time_budget: float | None = None,
    out: str | None = None,
    resume: bool = False,
    search: str = "gradient",
    tracker: str | None = None,
    key: str | None = None,
    mlflow_uri: str | None = None,
    name: str | None = None,
    alias: str = "champion",
    rpc_servers: int = 1,
    seed: int = 0,
    measure: str = "fixed",
    confirm: int = 0,
    library: str | None = None,
    library_from: str | None = None,
    transfer_only: bool = False,
    fast_math: bool = True,
    weight_prepack: bool = False,
    conv_layout: str = "NCHW",
    fold_batchnorm: bool = False,
    subpixel_conv_transpose: bool = True,
    warmup: str | None = None,
) -> dict[str, Any]:
    """import → partition → tune over RPC → compile/verify/time → report + register.

    With ``library``, the tune stage first measures schedules transferred from it (a warm
    start); with ``transfer_only`` too, it searches no further (``gradtune transfer``)."""
    job = make_job(
        target, model=model, entry=entry, input_shapes=input_shapes or {}, trials=trials,
        time_budget=time_budget, out=out or fresh_out_dir(model), resume=resume,
        search=search, tracker=tracker, key=key, mlflow_uri=mlflow_uri, name=name, alias=alias,
        rpc_servers=rpc_servers, seed=seed, measure=measure, confirm=confirm, library=library,
        library_from=library_from, transfer_only=transfer_only, fast_math=fast_math,
        weight_prepack=weight_prepack, conv_layout=conv_layout, fold_batchnorm=fold_batchnorm,
        subpixel_conv_transpose=subpixel_conv_transpose, warmup=warmup,
    )  # fmt: skip
    use_target_threads(job.target)  # before any kernel runs here or on the local fleet
    with exit_on_signals(), flow_logging.to_run_logs():
        imported = tuning.import_model(job)
        fused, tasks = tuning.partition_model(imported, job.target, job.lowering_options())
        tuned = tuning.tune_model_tasks(job, tasks, job.target)
        compiled = tuning.compile_model(job, imported, fused, job.target)
        return tuning.report_and_register(job, imported, tasks, tuned, compiled)
