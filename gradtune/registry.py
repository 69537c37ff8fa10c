"""MLflow: one run per tuning job, and a registered model that deployment pulls by alias.

The registered model is a custom pyfunc whose artifacts are the compiled library (``.so``),
TVM's JSONDatabase (so plain TVM can rebuild from the schedules) and an I/O description.
"""

from __future__ import annotations

import json
import logging
import math
import warnings
from pathlib import Path
from typing import Any

import mlflow
import numpy as np

from .errors import GradtuneError
from .preflight import check_tracking_uri
from .redact import redact_uri

log = logging.getLogger(__name__)

EXPERIMENT = "gradtune"


def default_tracking_uri(out_dir: Path) -> str:
    """Embedded default: a sqlite store beside the job's results (no server needed)."""
    return f"sqlite:///{(out_dir / 'mlflow.db').resolve()}"


def io_description(
    input_names: list[str], inputs: list[np.ndarray], device: str = "cpu"
) -> dict[str, Any]:
    return {
        "device": device,
        "inputs": [
            {"name": n, "shape": list(x.shape), "dtype": str(x.dtype)}
            for n, x in zip(input_names, inputs, strict=True)
        ],
    }


def use_experiment(tracking_uri: str, name: str) -> None:
    """Point MLflow at ``tracking_uri`` and experiment ``name`` (created when missing)."""
    mlflow.set_tracking_uri(tracking_uri)
    if tracking_uri.startswith("sqlite:///"):
        # Keep artifacts beside the sqlite store, not in the caller's working directory.
        artifact_root = Path(tracking_uri.removeprefix("sqlite:///")).parent / "mlartifacts"
        if mlflow.get_experiment_by_name(name) is None:
            mlflow.create_experiment(name, artifact_location=artifact_root.as_uri())
    mlflow.set_experiment(name)


def register(
    *,
    tracking_uri: str,
    registered_name: str,
    alias: str,
    params: dict[str, Any],
    round_metrics: list[dict[str, float]],
    final_metrics: dict[str, float],
    lib_path: Path,
    database_files: list[Path],
    report_files: list[Path],
    io: dict[str, Any],
    work_dir: Path,
) -> dict[str, str]:
    """Log the run and register the compiled model; returns run id, version, ``name@alias``."""
    from mlflow import MlflowClient

    use_experiment(tracking_uri, EXPERIMENT)
    io_path = work_dir / "io.json"
    io_path.write_text(json.dumps(io, indent=2))
    with mlflow.start_run(run_name=registered_name) as run:
        mlflow.log_params({k: mlflow_param(v) for k, v in params.items()})
        for step, metrics in enumerate(round_metrics, start=1):
            finite = {k: float(v) for k, v in metrics.items() if math.isfinite(float(v))}
            if finite:
                mlflow.log_metrics(finite, step=step)
        mlflow.log_metrics({k: float(v) for k, v in final_metrics.items() if math.isfinite(v)})
        for path in database_files:
            mlflow.log_artifact(str(path), artifact_path="database")
        for path in report_files:
            mlflow.log_artifact(str(path), artifact_path="report")
        artifacts = {"lib": str(lib_path), "io": str(io_path)}
        artifacts.update({p.stem: str(p) for p in database_files})
        with warnings.catch_warnings():
            # MLflow nudges towards type-hinted predict(); the VM takes several input forms.
            warnings.filterwarnings("ignore", message=".*Add type hints to the `predict`")
            info = mlflow.pyfunc.log_model(
                name="model",
                python_model=str(Path(__file__).with_name("serving.py")),
                artifacts=artifacts,
                registered_model_name=registered_name,
                pip_requirements=pip_requirements(
                    "apache-tvm", "apache-tvm-ffi", "numpy", "mlflow"
                ),
            )
        version = str(info.registered_model_version)
        run_id = run.info.run_id
    MlflowClient().set_registered_model_alias(registered_name, alias, version)
    return {"run_id": run_id, "version": version, "registered": f"{registered_name}@{alias}"}


def mlflow_param(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text[:6000]  # MLflow caps parameter values


def pip_requirements(*packages: str) -> list[str]:
    """Exact pins of the installed ``packages``, for a model that loads where they are."""
    from importlib.metadata import version

    return [f"{p}=={version(p)}" for p in packages]


def pull(ref: str, out_dir: Path, tracking_uri: str | None) -> dict[str, Any]:
    """Download ``NAME@ALIAS`` into ``out_dir``, load it, run one inference on random inputs."""
    import time

    if "@" not in ref or ref.startswith("@") or ref.endswith("@"):
        raise GradtuneError(f"{ref!r} is not NAME@ALIAS")
    if tracking_uri is None:
        raise GradtuneError(
            "no MLflow tracking URI: pass --mlflow-uri (the tune summary prints it) "
            "or set MLFLOW_TRACKING_URI"
        )
    check_tracking_uri(tracking_uri, existing=True)
    mlflow.set_tracking_uri(tracking_uri)
    name, alias = ref.split("@", 1)
    try:
        version = mlflow.MlflowClient().get_model_version_by_alias(name, alias)
    except mlflow.exceptions.MlflowException as err:
        raise GradtuneError(
            f"no registered model {ref} at {redact_uri(tracking_uri)}: {err.message}"
        ) from None
    out_dir.mkdir(parents=True, exist_ok=True)
    local = mlflow.artifacts.download_artifacts(
        artifact_uri=f"models:/{ref}", dst_path=str(out_dir)
    )
    model = mlflow.pyfunc.load_model(local)
    io = json.loads(next(Path(local).rglob("io.json")).read_text())
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(i["shape"]).astype(i["dtype"]) for i in io["inputs"]]
    start = time.perf_counter()
    output = model.predict(inputs if len(inputs) > 1 else inputs[0])
    ms = (time.perf_counter() - start) * 1e3
    outputs = output if isinstance(output, list) else [output]
    return {
        "model_dir": local,
        "version": version.version,
        "output_shapes": [list(np.asarray(o).shape) for o in outputs],
        "first_call_ms": ms,
        "finite": bool(all(np.isfinite(np.asarray(o)).all() for o in outputs)),
    }
