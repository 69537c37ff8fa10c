"""Everything a tuning job needs, checked before anything starts.

Prefect's temporary server takes seconds to start and the RPC fleet more; tuning takes
minutes. Input that cannot work must be refused before any of them, in one line, and leave
nothing behind, so that the error is the last line the user sees, not one buried in Prefect's
log after a minute of tuning. The checks run cheapest first: the settings themselves, then the
file system and the network, then the model run once in its own framework, then TVM (whose
import alone takes seconds). Nothing is written here: ``--out`` is created by the tuning stage.
"""

from __future__ import annotations

import base64
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from .errors import GradtuneError
from .job import TuneJob, check_lowering, check_out_dir, check_resumed_target, validate
from .redact import redact_uri


def checked_job(target: str | None, **settings: Any) -> TuneJob:
    """The job of ``settings`` (``TuneJob``'s fields) with its target resolved, once every
    setting, file, service and device it needs has been checked; raises ``GradtuneError``.

    It also imports the model, which the flow's import stage then reuses
    (``frontend.load_model`` keeps the last import).
    """
    from .frontend import fingerprint, load_model
    from .target import check_device, parse_target, read_target_spec

    job = TuneJob(**settings)
    validate(job)
    check_writable(job.out_dir, "--out")
    check_out_dir(job, fingerprint(job.model, job.entry, job.input_shapes))
    if job.mlflow_uri:
        check_tracking_uri(job.mlflow_uri)
    if job.tracker:
        from .measure.rpc_fleet import check_tracker, parse_tracker

        check_tracker(parse_tracker(job.tracker, job.key))
    check_device(read_target_spec(target))
    load_model(job.model, job.entry, job.input_shapes)
    job.target = parse_target(target)
    check_lowering(job)
    check_resumed_target(job)
    if job.library:
        check_library(job)
    return job


def check_library(job: TuneJob) -> None:
    """Refuse a schedule library that cannot serve the job: a source that does not exist, an
    unreachable registry, only schedules of another target, or, for a transfer, nothing in it
    (an empty library leaves a warm start cold, with a notice in the flow). It reads every
    source's database (downloading registered ones), which is what finding out takes."""
    from .target import make_target
    from .transfer.library import load_library, target_key
    from .transfer.run import library_spec, library_uri

    library = load_library(library_spec(job), library_uri(job))
    if job.transfer_only or not library.is_empty():
        library.check_target(target_key(make_target(job.target)))


def check_writable(path: Path, flag: str) -> None:
    """Refuse a directory that cannot be created or written, without leaving one behind.

    The nearest existing ancestor is tried with a directory made and removed at once: only
    doing it tells a read-only mount, ``/proc`` or a full quota from a usable place."""
    path = Path(path)
    existing = path
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        raise GradtuneError(f"{flag} {path}: {existing} is not a directory")
    try:
        Path(tempfile.mkdtemp(prefix=".gradtune-probe-", dir=existing)).rmdir()
    except OSError as err:
        raise GradtuneError(
            f"{flag} {path} cannot be written: {err.strerror or err} in {existing}"
        ) from None


# The stores MLflow 3 keeps a model registry in: its REST API, a SQL database (with an optional
# "+driver"), Databricks. It refuses its file store, so a plain path or file: URI would fail
# only at registration, after the whole tuning run.
REGISTRY_SCHEMES = frozenset(
    ("http", "https", "sqlite", "postgresql", "mysql", "mssql", "databricks", "databricks-uc")
)


def check_tracking_uri(uri: str, existing: bool = False) -> None:
    """Fail fast, in one line, when the tracking URI cannot hold a model registry or cannot be
    reached. ``existing``: the store must exist already (reading one must not create it)."""
    shown = redact_uri(uri)
    parts = urllib.parse.urlsplit(uri)
    scheme = parts.scheme.lower().split("+", 1)[0]
    if uri in ("databricks", "databricks-uc"):  # MLflow's names of a Databricks workspace
        return
    how = "use http(s)://HOST[:PORT], sqlite:///PATH/mlflow.db or a database URI"
    if len(scheme) <= 1 or scheme == "file":  # a Windows drive letter parses as a scheme
        raise GradtuneError(
            f"unsupported MLflow tracking URI {shown!r}: a local path, and MLflow 3 keeps its "
            f"model registry in a database, not in files; {how}"
        )
    if scheme not in REGISTRY_SCHEMES:
        raise GradtuneError(
            f"unsupported MLflow tracking URI {shown!r}: scheme {parts.scheme!r} cannot hold a "
            f"model registry; {how}"
        )
    if any(c.isspace() for c in uri):
        raise GradtuneError(f"MLflow tracking URI {shown!r} contains whitespace")
    if scheme in ("http", "https"):
        if not parts.hostname:
            raise GradtuneError(f"MLflow tracking URI {shown!r} names no host; {how}")
        # The login goes in a header: urllib would take "user:password@host" for the host.
        host = parts.netloc.rpartition("@")[2]
        health = urllib.parse.urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))
        request = urllib.request.Request(health + "/health")
        if parts.username is not None:
            login = f"{parts.username}:{parts.password or ''}".encode()
            request.add_header("Authorization", "Basic " + base64.b64encode(login).decode())
        try:
            with urllib.request.urlopen(request, timeout=5) as resp:
                if resp.status != 200:
                    raise GradtuneError(f"MLflow server {shown} answered HTTP {resp.status}")
        except (urllib.error.URLError, OSError, ValueError) as err:
            reason = getattr(err, "reason", err)
            raise GradtuneError(
                f"MLflow tracking URI {shown} cannot be reached: {reason}"
            ) from None
    elif scheme == "sqlite":
        if not uri.startswith("sqlite:///"):
            raise GradtuneError(
                f"MLflow tracking URI {shown!r}: a sqlite store is sqlite:///PATH (an in-memory "
                "one keeps nothing)"
            )
        store = Path(uri.removeprefix("sqlite:///"))
        if existing and not store.is_file():
            raise GradtuneError(f"MLflow sqlite store does not exist: {store}")
        if not store.parent.is_dir():
            raise GradtuneError(f"MLflow sqlite store directory does not exist: {store.parent}")
