"""MLflow: one run per tuning job, and a registered model that deployment pulls by alias.

The registered model is a custom pyfunc whose artifacts are the compiled library (``.so``),
TVM's JSONDatabase (so plain TVM can rebuild from the schedules), an I/O description and the
SHA-256 of each (``checksums.json``, for the pyfunc's own check). Every file of a version is
also digested into the version's tags, which ``pull`` checks before anything is loaded
(``gradtune.integrity``). What a registration needs is saved in the run's output directory
before it starts (``Registration``), so a registry that is down costs a later
``gradtune register OUT_DIR``, never the tuning.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import mlflow
import numpy as np

from .errors import GradtuneError
from .integrity import manifest, manifest_tags, mismatches, sha256_file, tagged_manifest
from .preflight import check_tracking_uri
from .redact import redact_uri

log = logging.getLogger(__name__)

EXPERIMENT = "gradtune"
REGISTRATION_FILE = "registration.json"
SERVING_CODE = Path(__file__).with_name("serving.py")  # the model's code, copied into it


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


@dataclass
class Registration:
    """What registering a finished run takes, saved in its output directory first, so that a
    registry that stays unreachable costs nothing: ``gradtune register OUT_DIR`` finishes it.

    Paths are relative to the output directory, which may be moved before registering.

    Parameters
    ----------
    registered_name : str
        Registered model name.
    alias : str
        Alias the new version gets.
    params : dict[str, Any], default {}
        MLflow run parameters.
    round_metrics : list[dict[str, float]], default []
        Metrics of each tuning round, logged at steps 1, 2, ...
    final_metrics : dict[str, float], default {}
        Metrics of the whole run.
    lib : str, default "model.so"
        The compiled library.
    database_files : list[str], default []
        TVM's JSONDatabase files (plain TVM rebuilds from them).
    report_files : list[str], default []
        Report, plot and tables, logged beside the model.
    io : dict[str, Any], default {}
        Input names, shapes and dtypes and the device (``io_description``).
    summary : dict[str, Any], default {}
        The run summary, completed with run id and version into ``summary.json``.
    tags : dict[str, str], default {}
        Tags the version is created with, beside its files' digests (``gradtune.provenance``).
    """

    registered_name: str
    alias: str
    params: dict[str, Any] = field(default_factory=dict)
    round_metrics: list[dict[str, float]] = field(default_factory=list)
    final_metrics: dict[str, float] = field(default_factory=dict)
    lib: str = "model.so"
    database_files: list[str] = field(default_factory=list)
    report_files: list[str] = field(default_factory=list)
    io: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)

    def save(self, out_dir: Path) -> Path:
        path = out_dir / REGISTRATION_FILE
        path.write_text(json.dumps(asdict(self), indent=1, default=str))
        return path

    @classmethod
    def load(cls, out_dir: Path) -> Registration:
        """The registration saved in ``out_dir``; one line when there is none or files are gone."""
        path = out_dir / REGISTRATION_FILE
        if not path.is_file():
            raise GradtuneError(
                f"{out_dir} holds no finished run to register (no {REGISTRATION_FILE}); "
                "a tune writes it once the model is compiled"
            )
        try:
            registration = cls(**json.loads(path.read_text()))
        except (json.JSONDecodeError, TypeError) as err:
            raise GradtuneError(f"{path} is unreadable: {err}") from None
        for name in (registration.lib, *registration.database_files, *registration.report_files):
            if not (out_dir / name).is_file():
                raise GradtuneError(f"{out_dir / name} is missing: nothing to register")
        return registration


def register(registration: Registration, tracking_uri: str, out_dir: Path) -> dict[str, str]:
    """Log the run and register its compiled model; returns run id, version and ``name@alias``.

    The version is created only once every file of the model is stored and read back with the
    SHA-256 it was uploaded with, and it is created with those digests as its tags (one database
    transaction), so a version never lacks files or checksums. Setting the alias comes last; if
    it fails, the version is deleted again, and ``NAME@ALIAS`` keeps naming the previous one.
    """
    check_tracking_uri(tracking_uri)
    use_experiment(tracking_uri, EXPERIMENT)
    reg = registration
    io_path = out_dir / "io.json"
    io_path.write_text(json.dumps(reg.io, indent=2))
    databases = [out_dir / name for name in reg.database_files]
    artifacts = {"lib": out_dir / reg.lib, "io": io_path, **{p.stem: p for p in databases}}
    digests = {key: sha256_file(path) for key, path in artifacts.items()}
    # For the pyfunc model's load_context, which sees only the files, not the registry's tags.
    checksums = out_dir / "checksums.json"
    checksums.write_text(json.dumps(digests, indent=1))
    artifacts["checksums"] = checksums
    uploaded = {f"artifacts/{p.name}": sha256_file(p) for p in artifacts.values()}
    uploaded[SERVING_CODE.name] = sha256_file(SERVING_CODE)
    with mlflow.start_run(run_name=reg.registered_name) as run:
        mlflow.log_params({k: mlflow_param(v) for k, v in reg.params.items()})
        for step, metrics in enumerate(reg.round_metrics, start=1):
            finite = {k: float(v) for k, v in metrics.items() if math.isfinite(float(v))}
            if finite:
                mlflow.log_metrics(finite, step=step)
        mlflow.log_metrics(
            {k: float(v) for k, v in reg.final_metrics.items() if math.isfinite(float(v))}
        )
        for path in databases:
            mlflow.log_artifact(str(path), artifact_path="database")
        for name in reg.report_files:
            mlflow.log_artifact(str(out_dir / name), artifact_path="report")
        with quiet_signature_notice():
            info = mlflow.pyfunc.log_model(
                name="model",
                python_model=str(SERVING_CODE),
                artifacts={key: str(path) for key, path in artifacts.items()},
                pip_requirements=pip_requirements(
                    "apache-tvm", "apache-tvm-ffi", "numpy", "mlflow"
                ),
            )
        files = stored_manifest(info.model_uri, uploaded)
        version = create_version(
            reg.registered_name, reg.alias, info.model_uri, info.model_id, run.info.run_id, files,
            reg.tags,
        )  # fmt: skip
    return {
        "run_id": run.info.run_id,
        "version": version,
        "registered": f"{reg.registered_name}@{reg.alias}",
    }


class _NoSignatureNotice(logging.Filter):
    """MLflow logs that it cannot infer a signature from ``predict``'s ndarray hint; none is
    wanted: the served model takes an array, a list or a dict."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Failed to infer model signature: Type hint")


@contextlib.contextmanager
def quiet_signature_notice():
    """``mlflow.pyfunc.log_model`` without MLflow's notice of the signature it did not infer."""
    logger, notice = logging.getLogger("mlflow.pyfunc"), _NoSignatureNotice()
    logger.addFilter(notice)
    try:
        yield
    finally:
        logger.removeFilter(notice)


def stored_manifest(model_uri: str, uploaded: dict[str, str]) -> dict[str, str]:
    """The digests of every file of the logged model as the artifact store returns it, after
    checking that the files uploaded from here came back unchanged."""
    with tempfile.TemporaryDirectory(prefix="gradtune-stored-") as tmp:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=tmp))
        files = manifest(local)
    for path, digest in sorted(uploaded.items()):
        if files.get(path) != digest:
            raise GradtuneError(
                f"the artifact store returned {path} of {model_uri} "
                f"{'changed' if path in files else 'missing'} right after its upload"
            )
    return files


def create_version(
    name: str,
    alias: str,
    model_uri: str,
    model_id: str,
    run_id: str,
    files: dict[str, str],
    tags: dict[str, str] | None = None,
) -> str:
    """A new version of ``name`` from the logged model, with its files' digests and ``tags`` as
    tags, given ``alias``; on any failure, no version of this run is left behind (as far as the
    registry still answers)."""
    client = mlflow.MlflowClient()
    try:
        client.create_registered_model(name)
    except mlflow.exceptions.MlflowException as err:
        if err.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    try:
        version = client.create_model_version(
            name,
            model_uri,
            run_id,
            tags={**(tags or {}), **manifest_tags(files)},
            model_id=model_id,
        ).version
        client.set_registered_model_alias(name, alias, version)
    except BaseException:
        # Also a version whose creation the server committed before the answer was lost.
        with contextlib.suppress(Exception):
            for stray in client.search_model_versions(f"name = '{name}' and run_id = '{run_id}'"):
                client.delete_model_version(name, stray.version)
        raise
    return str(version)


def mlflow_param(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text[:6000]  # MLflow caps parameter values


def pip_requirements(*packages: str) -> list[str]:
    """Exact pins of the installed ``packages``, for a model that loads where they are."""
    from importlib.metadata import version

    return [f"{p}=={version(p)}" for p in packages]


def pull(
    ref: str, out_dir: Path, tracking_uri: str | None, allow_unverified: bool = False
) -> dict[str, Any]:
    """Download ``NAME@ALIAS`` into ``out_dir``, check every file against the SHA-256 digests
    in the version's tags, then load it and run one inference on random inputs.

    A version registered without digests is refused unless ``allow_unverified``: loading it
    runs whatever code the artifact store holds, and nothing can tell whether that changed.
    """
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
    expected = tagged_manifest(version.tags)
    if not expected and not allow_unverified:
        raise GradtuneError(
            f"{ref} (version {version.version}) was registered without SHA-256 checksums, so "
            "the code it would load cannot be verified; pass --allow-unverified to load it anyway"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    download_verified(ref, out_dir, expected or None)
    model = mlflow.pyfunc.load_model(str(out_dir))
    io = json.loads((out_dir / "artifacts" / "io.json").read_text())
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(i["shape"]).astype(i["dtype"]) for i in io["inputs"]]
    start = time.perf_counter()
    output = model.predict(inputs if len(inputs) > 1 else inputs[0])
    ms = (time.perf_counter() - start) * 1e3
    outputs = output if isinstance(output, list) else [output]
    return {
        "model_dir": str(out_dir),
        "version": version.version,
        "verified": bool(expected),
        "output_shapes": [list(np.asarray(o).shape) for o in outputs],
        "first_call_ms": ms,
        "finite": bool(all(np.isfinite(np.asarray(o)).all() for o in outputs)),
    }


def download_verified(ref: str, out_dir: Path, expected: dict[str, str] | None) -> None:
    """The files of ``models:/ref`` into ``out_dir``, once all match ``expected`` (None: no
    check). They are downloaded into an empty directory first, so that files already in
    ``out_dir`` cannot pass for the model's, and a refused download leaves nothing behind."""
    staging = Path(tempfile.mkdtemp(prefix=".download-", dir=out_dir))
    try:
        local = Path(
            mlflow.artifacts.download_artifacts(
                artifact_uri=f"models:/{ref}", dst_path=str(staging)
            )
        )
        problems = mismatches(expected, manifest(local)) if expected is not None else []
        if problems:
            path, problem = problems[0]
            more = f" (and {len(problems) - 1} more file(s))" if len(problems) > 1 else ""
            raise GradtuneError(f"{Path(path).name} of {ref} {problem}{more}; nothing was loaded")
        for path in sorted(p for p in local.rglob("*") if p.is_file()):
            target = out_dir / path.relative_to(local)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
