"""The pretrained cost model in MLflow's registry: ``gradtune-costmodel-<target>@champion``.

Pretraining logs a run (parameters, loss per epoch, held-out ranking metrics) and registers
the weights as a pyfunc model (``costmodel_serving.py``: scores per-store feature arrays), so
any MLflow client can load it. Tuning asks the registry for the champion when a tracking
server is configured and otherwise uses the copy bundled with the package.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from gradtune.errors import GradtuneError

log = logging.getLogger("gradtune.costmodel")

EXPERIMENT = "gradtune-costmodel"
ALIAS = "champion"


def registered_name(target_kind: str) -> str:
    return f"gradtune-costmodel-{target_kind}"


def register(
    weights: Path,
    tracking_uri: str,
    target_kind: str,
    params: dict[str, Any],
    history: list[float],
    metrics: dict[str, float],
    card: Path | None = None,
) -> dict[str, str]:
    """Log a pretraining run and make its weights the champion; returns run id, version, ref."""
    import mlflow
    from mlflow import MlflowClient

    from gradtune.preflight import check_tracking_uri
    from gradtune.registry import (
        mlflow_param,
        pip_requirements,
        quiet_signature_notice,
        use_experiment,
    )

    check_tracking_uri(tracking_uri)
    use_experiment(tracking_uri, EXPERIMENT)
    name = registered_name(target_kind)
    with mlflow.start_run(run_name=f"pretrain-{target_kind}") as run:
        mlflow.log_params({k: mlflow_param(v) for k, v in params.items()})
        for epoch, loss in enumerate(history, start=1):
            mlflow.log_metric("train_loss", float(loss), step=epoch)
        finite = {k: float(v) for k, v in metrics.items() if math.isfinite(float(v))}
        if finite:
            mlflow.log_metrics(finite)
        if card is not None and card.is_file():
            mlflow.log_artifact(str(card), artifact_path="card")
        with quiet_signature_notice():
            info = mlflow.pyfunc.log_model(
                name="costmodel",
                python_model=str(Path(__file__).with_name("costmodel_serving.py")),
                artifacts={"weights": str(weights)},
                registered_model_name=name,
                pip_requirements=pip_requirements("torch", "numpy", "mlflow"),
            )
        version = str(info.registered_model_version)
    MlflowClient().set_registered_model_alias(name, ALIAS, version)
    return {"run_id": run.info.run_id, "version": version, "registered": f"{name}@{ALIAS}"}


def download_champion(tracking_uri: str, target_kind: str, dst: Path) -> Path:
    """The champion's weights file, downloaded under ``dst``; GradtuneError when there is none."""
    import mlflow

    from gradtune.preflight import check_tracking_uri
    from gradtune.redact import redact_uri

    check_tracking_uri(tracking_uri)
    mlflow.set_tracking_uri(tracking_uri)
    ref = f"{registered_name(target_kind)}@{ALIAS}"
    try:
        mlflow.MlflowClient().get_model_version_by_alias(registered_name(target_kind), ALIAS)
    except mlflow.exceptions.MlflowException as err:
        raise GradtuneError(
            f"no registered cost model {ref} at {redact_uri(tracking_uri)}: {err.message}"
        ) from None
    dst.mkdir(parents=True, exist_ok=True)
    local = Path(
        mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{ref}", dst_path=str(dst))
    )
    found = sorted(local.rglob("*.pt"))
    if not found:
        raise GradtuneError(f"{ref} at {redact_uri(tracking_uri)} has no weights artifact")
    return found[0]


def describe(weights: Path) -> dict[str, Any]:
    """The provenance file written beside bundled weights (empty when absent)."""
    info = weights.with_suffix(".json")
    return json.loads(info.read_text()) if info.is_file() else {}
