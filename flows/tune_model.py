"""Flow: tune one model end to end and register it (the CLI's ``gradtune tune``)."""

from __future__ import annotations

from typing import Any

from prefect import flow

from gradtune.job import TuneJob, mark_out_dir
from gradtune.pipeline import StageTimes
from tasks.tuning import (
    compile_model,
    import_model,
    partition_model,
    report_and_register,
    tune_model_tasks,
)


@flow(name="tune-model", log_prints=False)
def tune_model(job: dict[str, Any], fingerprint: str) -> dict[str, Any]:
    """import → partition → tune over RPC → compile/verify/time → report + register."""
    spec = TuneJob(**job)
    times = StageTimes()
    with times.stage("import"):
        model = import_model(spec)
    with times.stage("partition"):
        fused, tasks = partition_model(model, spec.target)
    # Written only once the model imported: bad input leaves no directory behind.
    mark_out_dir(spec, fingerprint)
    with times.stage("tune"):
        tuned = tune_model_tasks(spec, tasks, spec.target)
    with times.stage("compile"):
        compiled = compile_model(spec, model, fused, spec.target)
    with times.stage("register"):
        summary = report_and_register(spec, model, tasks, tuned, compiled, times.seconds)
    return summary
