"""A tuning job's settings, validated before anything is written, and its output directory."""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .errors import GradtuneError
from .target import parse_target

RUN_FILE = "run.json"  # marks a gradtune output directory and names the model it belongs to


@dataclass
class TuneJob:
    """What to tune, for which target, within which budget, and where the results go.

    Parameters
    ----------
    model : str
        A ``.onnx`` file, or a ``.py`` file defining ``entry``.
    entry : str, default "get_model"
        Function of the ``.py`` file returning ``(nn.Module, example inputs)``.
    input_shapes : dict[str, list[int]], default {}
        Shapes of an ONNX model's dynamic inputs, by input name.
    target : dict[str, Any], default {}
        The resolved target config (``target.parse_target``); ``make_job`` fills it in.
    trials : int, default 128
        Total measured trials, resumed ones included.
    time_budget : float | None, default None
        Seconds of tuning after which to stop; None: only ``trials`` bounds it.
    out : str, default "runs/latest"
        Output directory: database, report, compiled library, default MLflow store.
    resume : bool, default False
        Continue in an ``out`` that already holds this model's results.
    search : str, default "gradient"
        Search strategy: "gradient" (Felix) or one of MetaSchedule's by name.
    tracker : str | None, default None
        ``HOST:PORT`` of an existing RPC tracker; None starts a local fleet.
    key : str | None, default None
        Device key on ``tracker``.
    mlflow_uri : str | None, default None
        MLflow tracking URI; None: a sqlite store under ``out``.
    name : str | None, default None
        Registered model name; None: ``gradtune-<model file stem>``.
    alias : str, default "champion"
        Alias the registered version gets.
    rpc_servers : int, default 1
        Servers of the local fleet (1 keeps measurements uncontended).
    seed : int, default 0
        Seed of the search.
    measure : str, default "fixed"
        How candidates are timed: "fixed" (number × repeat) or "adaptive" (until the CV of
        micro-batches settles; ``measure/adaptive.py``).
    confirm : int, default 0
        After the search, each task's that many fastest programs and its default are timed
        again, quietly and in rotation, and the fastest ships (``measure/confirm.py``); a time
        budget leaves a tenth of itself to it. 0: the search's recorded best ships.
    library : str | None, default None
        A schedule library (``transfer.library.load_library``'s SPEC): what ``tune
        --warm-start`` starts the search from, or what ``transfer`` transfers.
    library_from : str | None, default None
        The library's source to transfer from: "auto" (Eq. 1), "all" (every source's
        schedules together), or a NAME@ALIAS or run directory, which is then the whole
        library. None: "all" for a warm start, "auto" for a transfer
        (``transfer.run.source_choice``).
    transfer_only : bool, default False
        Transfer and search no further (``gradtune transfer``).
    fast_math : bool, default True
        Sigmoid, SiLU, GELU and tanh by vectorizable approximations instead of libm
        (``partition.Lowering``; ``--no-fast-math`` for libm's).
    weight_prepack : bool, default False
        Weights stored in each tuned kernel's loop order, folded at compile time; CPU targets
        only (``partition.Lowering``).
    conv_layout : str, default "NCHW"
        The data layout 2-D convolutions are tuned in, "NCHW" or "NHWC"
        (``partition.Lowering``).
    fold_batchnorm : bool, default False
        BatchNorms after 2-D convolutions folded into their weights (``partition.Lowering``).
    subpixel_conv_transpose : bool, default True
        2-D transposed convolutions as one dense convolution over their output phases
        (``partition.Lowering``; ``--no-subpixel-conv-transpose`` for TOPI's).
    warmup : str | None, default None
        How the task scheduler's first batches go round: "model" (MetaSchedule's, one per
        task in the model's order), "stake" (one per task, the most latency at stake first),
        "fresh" (likewise, the tasks without transferred or resumed programs first) or "skip"
        (none: tasks with a measured program are weighed from the start); None:
        "stake" after a warm start, else "model" (``tune.start_warmup``).
    """

    model: str
    entry: str = "get_model"
    input_shapes: dict[str, list[int]] = field(default_factory=dict)
    target: dict[str, Any] = field(default_factory=dict)
    trials: int = 128
    time_budget: float | None = None
    out: str = "runs/latest"
    resume: bool = False
    search: str = "gradient"
    tracker: str | None = None
    key: str | None = None
    mlflow_uri: str | None = None
    name: str | None = None
    alias: str = "champion"
    rpc_servers: int = 1
    seed: int = 0
    measure: str = "fixed"
    confirm: int = 0
    library: str | None = None
    library_from: str | None = None
    transfer_only: bool = False
    fast_math: bool = True
    weight_prepack: bool = False
    conv_layout: str = "NCHW"
    fold_batchnorm: bool = False
    subpixel_conv_transpose: bool = True
    warmup: str | None = None

    @property
    def out_dir(self) -> Path:
        return Path(self.out)

    def lowering_options(self) -> dict[str, Any]:
        """The job's values of ``partition.Lowering``'s fields (what changes the tuned
        workloads), each a field of the job by the same name."""
        from dataclasses import fields

        from .partition import Lowering

        return {f.name: getattr(self, f.name) for f in fields(Lowering)}

    def flow_parameters(self) -> dict[str, Any]:
        """The job as the parameters of the ``tune-model`` flow: its fields, the resolved target
        as JSON text (which ``make_job`` resolves to the same config)."""
        return {**asdict(self), "target": json.dumps(self.target)}


def make_job(target: str | None = None, **settings: Any) -> TuneJob:
    """A checked job (``validate``) with its target resolved by ``target.parse_target``.

    ``settings`` are ``TuneJob``'s other fields; ``target`` is None or "llvm" (this CPU),
    "cuda", or a JSON target object. The ``tune-model`` flow builds its job here, so a flow
    started from Prefect's UI has its settings checked as the CLI's are (the CLI's
    ``preflight.checked_job`` also checks files, services, the model and the device).
    """
    job = TuneJob(**settings)
    validate(job)
    job.target = parse_target(target)
    check_lowering(job)
    return job


def check_lowering(job: TuneJob) -> None:
    """Refuse lowering and measuring options the resolved target cannot take."""
    from .partition import Lowering
    from .target import is_gpu

    Lowering(**job.lowering_options()).check_target(job.target.get("kind"))
    if job.measure == "handoff" and is_gpu(job.target):
        # A GPU kernel's input is in device memory, not in a core's cache.
        raise GradtuneError("--measure handoff times CPU kernels only; use fixed or adaptive")


def fresh_out_dir(model: str, root: str | Path = "runs") -> str:
    """``runs/<model stem>-<UTC time>``: a new output directory per run, so that runs of one
    deployment never land in each other's results (a suffix tells apart two in one second)."""
    base = Path(root) / f"{Path(model).stem}-{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
    out, n = base, 1
    while out.exists():
        n += 1
        out = base.with_name(f"{base.name}-{n}")
    return str(out)


_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def validate(job: TuneJob) -> None:
    """Reject bad settings in one line each, before any file is created and without importing
    a framework (so a typo costs well under a second)."""
    from .frontend import check_model_file
    from .measure.rpc_fleet import parse_tracker
    from .measure.runner import MEASURE_MODES
    from .partition import CONV_LAYOUT_CHOICES
    from .search import SEARCH_STRATEGIES, WARMUPS

    check_model_file(job.model, job.input_shapes)
    if job.trials <= 0:
        raise GradtuneError(f"--trials must be positive, got {job.trials}")
    if job.time_budget is not None and not (math.isfinite(job.time_budget) and job.time_budget > 0):
        raise GradtuneError(
            f"--time-budget must be positive, finite seconds, got {job.time_budget}"
        )
    if job.search not in SEARCH_STRATEGIES:
        raise GradtuneError(
            f"unknown --search {job.search!r}; choose one of {', '.join(SEARCH_STRATEGIES)}"
        )
    if job.measure not in MEASURE_MODES:
        raise GradtuneError(
            f"unknown --measure {job.measure!r}; choose one of {', '.join(MEASURE_MODES)}"
        )
    if job.warmup is not None and job.warmup not in WARMUPS:
        raise GradtuneError(f"unknown --warmup {job.warmup!r}; choose one of {', '.join(WARMUPS)}")
    if job.library_from is not None and job.library is None:
        raise GradtuneError(
            f"--from {job.library_from} needs --warm-start: a library to take it from"
        )
    if job.confirm < 0:
        raise GradtuneError(f"--confirm must be 0 or more programs per task, got {job.confirm}")
    if job.conv_layout not in CONV_LAYOUT_CHOICES:
        raise GradtuneError(
            f"unknown --conv-layout {job.conv_layout!r}; choose one of "
            f"{', '.join(CONV_LAYOUT_CHOICES)}"
        )
    if job.name is not None and not _NAME_RE.match(job.name):
        raise GradtuneError(f"--name {job.name!r}: use letters, digits, '.', '_' or '-'")
    if not _NAME_RE.match(job.alias):
        raise GradtuneError(f"alias {job.alias!r}: use letters, digits, '.', '_' or '-'")
    if job.alias.lower() == "latest" or re.fullmatch(r"v\d+", job.alias.lower()):
        raise GradtuneError(f"alias {job.alias!r} is reserved by MLflow's registry; choose another")
    if job.transfer_only and not job.library:
        raise GradtuneError("transfer needs a schedule library (--library)")
    if job.rpc_servers <= 0:
        raise GradtuneError("--rpc-servers must be positive")
    if job.tracker:
        port = parse_tracker(job.tracker, job.key).port
        if not 0 < port < 65536:
            raise GradtuneError(f"--tracker {job.tracker!r}: port {port} is not in 1-65535")


def check_out_dir(job: TuneJob, fingerprint: str) -> None:
    """Refuse a directory holding other results, unless resuming the same model.

    It needs no target, so it runs before TVM is imported; ``check_resumed_target`` compares
    the target once it is resolved."""
    out = job.out_dir
    if out.exists() and not out.is_dir():
        raise GradtuneError(f"--out {out} exists and is not a directory")
    if not out.exists() or not any(out.iterdir()):
        return
    run_file = out / RUN_FILE
    if not run_file.exists():
        raise GradtuneError(
            f"--out {out} is not empty and holds no gradtune results; choose another"
        )
    try:
        previous = json.loads(run_file.read_text())
    except (json.JSONDecodeError, OSError):
        raise GradtuneError(
            f"--out {out}: {RUN_FILE} is unreadable; choose another directory"
        ) from None
    if previous.get("fingerprint") != fingerprint:
        raise GradtuneError(
            f"--out {out} holds results of another model ({previous.get('model')}); "
            "choose another directory"
        )
    if not job.resume:
        raise GradtuneError(
            f"--out {out} already holds results of this model; pass --resume to continue"
        )


def check_resumed_target(job: TuneJob) -> None:
    """Refuse to resume, for another target or lowering, a directory ``check_out_dir`` let
    through: its records would be of other workloads, and the search would start over."""
    run_file = job.out_dir / RUN_FILE
    if not run_file.exists():
        return
    previous = json.loads(run_file.read_text())
    if previous.get("target") != job.target:
        raise GradtuneError(
            f"--out {job.out_dir} was tuned for target {json.dumps(previous.get('target'))}, "
            f"not {json.dumps(job.target)}; choose another directory"
        )
    from .partition import recorded_lowering  # TVM is imported by now (the model was loaded)

    # Directories from before an option was recorded were tuned without it.
    before = recorded_lowering(previous.get("lowering"))
    if before != job.lowering_options():
        flags = "--fast-math" if before["fast_math"] else "--no-fast-math"
        flags += " --weight-prepack" if before["weight_prepack"] else ""
        flags += (
            f" --conv-layout {before['conv_layout']}" if before["conv_layout"] != "NCHW" else ""
        )
        flags += " --fold-batchnorm" if before["fold_batchnorm"] else ""
        flags += "" if before["subpixel_conv_transpose"] else " --no-subpixel-conv-transpose"
        raise GradtuneError(
            f"--out {job.out_dir} was tuned with {flags}; resume with the same options or "
            "choose another directory"
        )


def mark_out_dir(job: TuneJob, fingerprint: str) -> None:
    """Create the output directory and record whose results it holds (``RUN_FILE``)."""
    job.out_dir.mkdir(parents=True, exist_ok=True)
    record = {
        "model": job.model,
        "entry": job.entry,
        "fingerprint": fingerprint,
        "target": job.target,
        "lowering": job.lowering_options(),
    }
    (job.out_dir / RUN_FILE).write_text(json.dumps(record, indent=2))
