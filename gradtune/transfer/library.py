"""The schedule library: every tuned model's best schedule per workload, to transfer from.

A source is one tuned model: a run directory (its TVM JSONDatabase and the partition table
``database_tasks.json`` that names each task's kernel class), or a registered model
``NAME@ALIAS`` whose database artifacts are downloaded from MLflow and checked against the
SHA-256 digests in the version's tags. ``registry`` stands for every gradtune model in the
configured registry (each version an alias names). A source keeps, per workload, its fastest
measured schedule that is not the default one: the paper's "auto-schedule of a kernel".

Records are indexed by target (a schedule is tuned for one CPU and core count; records of
another target are never mixed in), kernel class (the fused operator sequence without shapes,
as ``partition.kernel_class`` names it) and workload (structural hash). A database written
before the partition table existed has its classes read from its blocks' names instead
(``partition.module_kernel_class``), prefixed ``blocks:``; ``classes_of`` gives a task both.

A schedule transfers within its **transfer class**: the anchor operator's family (conv2d,
matmul, softmax, ...: ``partition.operator_family``) for a compute kernel, the kernel class
itself for the rest (pooling, concatenation, resizing). A schedule is offered only to a run
whose lowering shaped its kernel's loops alike (``partition.SHAPING_OPTIONS``: a transposed
convolution's sub-pixel lowering, the convolutions' data layout), which the partition table
records per row: a schedule of TOPI's zero-spread transposed convolution fits no sketch of the
sub-pixel one, and would only be counted invalid. The paper's classes are whole fused
sequences because Ansor's sketches differ with them; MetaSchedule inlines an elementwise
epilogue into one block, so ``conv2d+add+relu`` and BatchNorm's
``conv2d+subtract+divide+multiply+add+relu`` have sketches with the same sampling instructions
on the same loops (``apply.structure_text``). Of five CNNs tuned on one CPU, no exact
convolution class was shared by more than 3 of them; the conv2d family is in all 5. Which of a
class's schedules are tried first is the nearest in shape (``apply.nearest_first``).

A source database that is corrupt or truncated beyond repair is skipped and counted, never
fatal: it is read from a copy repaired as a resumed run's would be, so the source is untouched.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import GradtuneError
from ..job import RUN_FILE
from ..measure.latency import median_seconds
from ..partition import (
    OTHER_FAMILY,
    TuningTask,
    module_kernel_class,
    operator_family,
    recorded_lowering,
    shaping_lowering,
)
from ..redact import redact_uri

log = logging.getLogger(__name__)

TASK_TABLE = "database_tasks.json"  # beside the database, so registering logs it with it
DATABASE_FILES = ("database_workload.json", "database_tuning_record.json")
REGISTRY = "registry"  # the SPEC item meaning every gradtune model in the MLflow registry
BLOCKS = "blocks:"  # prefix of a kernel class read from block names (no partition table)


def workload_hash(mod: Any) -> str:
    import tvm_ffi

    return str(int(tvm_ffi.structural_hash(mod)))


def write_task_table(out_dir: Path, tasks: list[TuningTask], lowering: dict[str, Any]) -> Path:
    """The partition table of a run, machine-readable: what each workload of its database is
    (task, kernel class, weight, FLOPs, untuned µs and share of the untuned kernel time) and
    the options of the run's ``lowering`` that shaped its loop nest (``shaping_lowering``)."""
    total = sum(t.untuned_total_us for t in tasks if math.isfinite(t.untuned_us))
    rows = [
        {
            "task": t.name,
            "kernel_class": t.kernel_class,
            "workload": workload_hash(t.mod),
            "weight": t.weight,
            "flops": t.flops,
            "untuned_us": t.untuned_us if math.isfinite(t.untuned_us) else None,
            "share": t.untuned_total_us / total if total and math.isfinite(t.untuned_us) else None,
            "lowering": shaping_lowering(lowering, t.kernel_class),
        }
        for t in tasks
    ]
    path = out_dir / TASK_TABLE
    path.write_text(json.dumps(rows, indent=1))
    return path


def target_key(target: Any) -> str:
    """A TVM target as canonical JSON text: equal for equal configs, as records store it."""
    return str(target)


def target_label(key: str) -> str:
    """``llvm znver4 × 2 cores`` for a target key."""
    try:
        config = json.loads(key)
    except json.JSONDecodeError:
        return key
    parts = [config.get("kind", "?")]
    for name in ("mcpu", "arch"):
        if config.get(name):
            parts.append(str(config[name]))
    if config.get("num-cores"):
        parts.append(f"× {config['num-cores']} cores")
    return " ".join(parts)


def classes_of(task: TuningTask) -> set[str]:
    """The library keys a task's schedules may be filed under: its kernel class, and the one
    its blocks' names give (the class of a source without a partition table)."""
    if task.mod is None:  # a task described, not extracted (a hand-built table)
        return {task.kernel_class}
    return {task.kernel_class, BLOCKS + module_kernel_class(task.mod)}


def transfer_class(kernel_class: str) -> str:
    """What a schedule of ``kernel_class`` may transfer to: its operator family, or the class
    itself for a kernel of no compute family (module docstring)."""
    family = operator_family(kernel_class.removeprefix(BLOCKS))
    return kernel_class if family == OTHER_FAMILY else family


@dataclass
class Schedule:
    """One source's fastest measured schedule of one workload."""

    source: str
    target: str  # target_key
    kernel_class: str
    workload: str  # structural hash of the source workload
    task: str  # the task's name in the source ("" when unknown)
    trace: Any  # tvm Trace, decisions included
    mod: Any  # the source workload
    us: float  # median latency on the source's device
    lowering: dict[str, Any] = field(default_factory=dict)  # its shaping_lowering

    def fits(self, lowering: dict[str, Any]) -> bool:
        """Whether this schedule was tuned under the options of ``lowering`` (a run's
        ``recorded_lowering``) that shape its kernel class's loops."""
        return self.lowering == shaping_lowering(lowering, self.kernel_class.removeprefix(BLOCKS))


@dataclass
class Source:
    """A tuned model's schedules for one target."""

    name: str
    target: str
    schedules: list[Schedule] = field(default_factory=list)

    def by_class(self) -> dict[str, list[Schedule]]:
        out: dict[str, list[Schedule]] = defaultdict(list)
        for s in self.schedules:
            out[s.kernel_class].append(s)
        return dict(out)

    def fitting(self, lowering: dict[str, Any]) -> Source:
        """This source without the schedules tuned under another lowering of their loops
        (``Schedule.fits``): they would fit none of this run's sketches."""
        return Source(self.name, self.target, [s for s in self.schedules if s.fits(lowering)])

    def matching(self, task: TuningTask) -> list[Schedule]:
        """The schedules of the task's kernel class, then those of the rest of its transfer
        class; each the source's fastest first."""
        keys = classes_of(task)
        kin = {transfer_class(k) for k in keys}
        exact = [s for s in self.schedules if s.kernel_class in keys]
        rest = [
            s
            for s in self.schedules
            if s.kernel_class not in keys and transfer_class(s.kernel_class) in kin
        ]
        return sorted(exact, key=lambda s: s.us) + sorted(rest, key=lambda s: s.us)


@dataclass
class Library:
    sources: list[Source] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # source → why it was skipped

    def targets(self) -> set[str]:
        return {s.target for s in self.sources if s.schedules}

    def for_target(self, key: str) -> list[Source]:
        """The sources tuned for ``key``; nothing of another target."""
        return [s for s in self.sources if s.target == key and s.schedules]

    def index(self) -> dict[tuple[str, str, str], list[Schedule]]:
        """(target, kernel class, workload) → the schedules filed there."""
        out: dict[tuple[str, str, str], list[Schedule]] = defaultdict(list)
        for source in self.sources:
            for s in source.schedules:
                out[(s.target, s.kernel_class, s.workload)].append(s)
        return dict(out)

    def is_empty(self) -> bool:
        """No tuned schedule of any target: nothing tuned yet, or nothing readable."""
        return not self.targets()

    def empty_reason(self) -> str:
        skipped = f" ({len(self.skipped)} source(s) skipped as unreadable)" if self.skipped else ""
        return f"the schedule library is empty: no tuned schedules{skipped}"

    def check_target(self, key: str) -> list[Source]:
        """The sources for ``key``; one line when there are none (empty, or another target)."""
        found = self.for_target(key)
        if found:
            return found
        others = sorted(self.targets())
        if not others:
            raise GradtuneError(self.empty_reason())
        raise GradtuneError(
            f"the schedule library holds schedules for target {target_label(others[0])}"
            + (f" (and {len(others) - 1} other(s))" if len(others) > 1 else "")
            + f", not for this run's target {target_label(key)}; its schedules cannot be reused"
        )


# --------------------------------------------------------------------------- reading sources


def read_database(name: str, directory: Path, top: int = 1) -> list[Source]:
    """The sources (one per target) of the JSONDatabase in ``directory``: per workload the
    ``top`` fastest non-default records, classed by the partition table beside it.

    Raises ``GradtuneError`` for a database that cannot be read even once repaired."""
    from tvm.s_tir import meta_schedule as ms

    from ..database_repair import repair_database
    from ..measure.baseline import is_default

    table_path = directory / TASK_TABLE
    # A table written before it recorded the lowering: the run's own record of it when the
    # directory is a run's, else the lowering of that time (``recorded_lowering``).
    run_lowering = recorded_lowering(_run_record(directory).get("lowering"))
    table: dict[str, dict] = {}
    if table_path.is_file():
        try:
            table = {row["workload"]: row for row in json.loads(table_path.read_text())}
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise GradtuneError(f"{table_path} is unreadable ({err})") from None
    with tempfile.TemporaryDirectory(prefix="gradtune-library-") as tmp:
        copies = [Path(tmp) / f for f in DATABASE_FILES]
        for f, copy in zip(DATABASE_FILES, copies, strict=True):
            if not (directory / f).is_file():
                raise GradtuneError(f"{directory / f} is missing")
            shutil.copyfile(directory / f, copy)
        try:
            repair_database(*copies)
            database = ms.database.JSONDatabase(
                path_workload=str(copies[0]),
                path_tuning_record=str(copies[1]),
                allow_missing=False,
                module_equality="structural",
            )
            records = database.get_all_tuning_records()
        except Exception as err:  # TVM's own parse errors name neither file nor line
            reason = str(err).strip().splitlines()
            raise GradtuneError(f"{reason[-1] if reason else type(err).__name__}") from None
    best: dict[tuple[str, str], list[tuple[float, Any]]] = defaultdict(list)
    for record in records:
        secs = [float(x) for x in (record.run_secs or [])]
        if not secs or is_default(record) or not all(math.isfinite(x) for x in secs):
            continue
        key = (target_key(record.target), workload_hash(record.workload.mod))
        best[key].append((1e6 * median_seconds(secs), record))
    sources: dict[str, Source] = {}
    for (target, workload), found in best.items():
        found.sort(key=lambda pair: pair[0])
        for us, record in found[:top]:
            row = table.get(workload)
            kernel_class = (
                row["kernel_class"] if row else BLOCKS + module_kernel_class(record.workload.mod)
            )
            shaped = row.get("lowering") if row else None
            if shaped is None:
                shaped = shaping_lowering(run_lowering, kernel_class.removeprefix(BLOCKS))
            source = sources.setdefault(target, Source(name=name, target=target))
            source.schedules.append(
                Schedule(
                    source=name,
                    target=target,
                    kernel_class=kernel_class,
                    workload=workload,
                    task=row["task"] if row else "",
                    trace=record.trace,
                    mod=record.workload.mod,
                    us=us,
                    lowering=shaped,
                )
            )
    return list(sources.values())


def _run_record(directory: Path) -> dict[str, Any]:
    """The run's record beside its database; empty for a registered model's download
    or a record that cannot be read (its table's own rows then say what they can)."""
    try:
        record = json.loads((directory / RUN_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return record if isinstance(record, dict) else {}


def run_dirs(path: Path) -> list[Path]:
    """``path`` if it holds a tuning database, else its subdirectories that do (``runs/``)."""
    if (path / DATABASE_FILES[1]).is_file():
        return [path]
    return sorted(p for p in path.iterdir() if p.is_dir() and (p / DATABASE_FILES[1]).is_file())


def is_registered_ref(item: str) -> bool:
    return "@" in item and not item.startswith("@") and not item.endswith("@")


def registered_database(ref: str, tracking_uri: str, dst: Path) -> Path:
    """Download the database files (and partition table) of ``NAME@ALIAS`` into ``dst``,
    each checked against the SHA-256 digest its version was registered with."""
    import mlflow

    from ..integrity import sha256_file, tagged_manifest

    # A bar per file would bury the ranking printed next.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    mlflow.set_tracking_uri(tracking_uri)
    name, alias = ref.split("@", 1)
    client = mlflow.MlflowClient()
    try:
        version = client.get_model_version_by_alias(name, alias)
    except mlflow.exceptions.MlflowException as err:
        raise GradtuneError(
            f"no registered model {ref} at {redact_uri(tracking_uri)}: {err.message}"
        ) from None
    files = {a.path.rsplit("/", 1)[-1] for a in client.list_artifacts(version.run_id, "database")}
    if DATABASE_FILES[1] not in files:
        raise GradtuneError(f"{ref} is not a tuned model: its run logged no tuning database")
    local = Path(
        mlflow.artifacts.download_artifacts(
            run_id=version.run_id, artifact_path="database", dst_path=str(dst)
        )
    )
    expected = tagged_manifest(version.tags)
    for path in local.iterdir():
        digest = expected.get(f"artifacts/{path.name}")
        if digest is not None and sha256_file(path) != digest:
            raise GradtuneError(f"{path.name} of {ref} does not match its registered SHA-256")
    return local


def registered_models(tracking_uri: str) -> list[str]:
    """``NAME@ALIAS`` of every version an alias names, of every registered model whose run
    logged a tuning database (cost models and other registrations have none)."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    client = mlflow.MlflowClient()
    refs = []
    for model in client.search_registered_models():
        by_version: dict[str, str] = {}
        for alias, version in sorted((model.aliases or {}).items()):
            by_version.setdefault(str(version), alias)
        for version, alias in sorted(by_version.items()):
            run_id = client.get_model_version(model.name, version).run_id
            logged = client.list_artifacts(run_id, "database") if run_id else []
            if any(a.path.endswith(DATABASE_FILES[1]) for a in logged):
                refs.append(f"{model.name}@{alias}")
    return refs


def spec_items(spec: str) -> list[str]:
    items = [item.strip() for item in spec.split(",") if item.strip()]
    if not items:
        raise GradtuneError("empty library SPEC: name run directories, NAME@ALIAS or registry")
    return items


def check_spec(spec: str, tracking_uri: str | None) -> None:
    """Refuse a SPEC that cannot work, without reading any database: a missing directory, a
    registry reference without a reachable registry."""
    from ..preflight import check_tracking_uri

    for item in spec_items(spec):
        if item == REGISTRY or is_registered_ref(item):
            if not tracking_uri:
                raise GradtuneError(
                    f"library {item!r} is in an MLflow registry: pass --mlflow-uri or set "
                    "MLFLOW_TRACKING_URI"
                )
            check_tracking_uri(tracking_uri, existing=True)
        elif not Path(item).is_dir():
            raise GradtuneError(
                f"library {item!r}: no such run directory (nor NAME@ALIAS, nor {REGISTRY!r})"
            )


def load_library(spec: str, tracking_uri: str | None = None, top: int = 1) -> Library:
    """The library of ``spec``: comma-separated run directories (or directories of them, such
    as ``runs/``), ``NAME@ALIAS`` and ``registry`` (every gradtune model at ``tracking_uri``).

    A database that cannot be read is skipped and counted (``Library.skipped``); a directory
    holding no run yet, or a registry without tuned models, adds nothing (``Library.is_empty``).
    A spec naming what does not exist (a directory, a registered model, the registry) is one
    line."""
    check_spec(spec, tracking_uri)
    library = Library()
    items: list[str] = []
    for item in spec_items(spec):
        if item == REGISTRY:
            items += registered_models(tracking_uri)
        else:
            items.append(item)
    seen = set()
    for item in items:
        if item in seen:
            continue
        seen.add(item)
        if is_registered_ref(item) and not Path(item).is_dir():
            with tempfile.TemporaryDirectory(prefix="gradtune-registered-") as tmp:
                local = registered_database(item, tracking_uri, Path(tmp))
                _add(library, item, local, top)
            continue
        # A directory that exists but holds no run yet (a fresh ``runs/``) is an empty
        # library, not a mistake: a warm start then tunes cold.
        for directory in run_dirs(Path(item)):
            _add(library, str(directory), directory, top)
    return library


def _add(library: Library, name: str, directory: Path, top: int) -> None:
    try:
        library.sources += read_database(name, directory, top)
    except GradtuneError as err:
        log.warning("library source %s skipped: %s", name, err)
        library.skipped[name] = str(err)


def describe(library: Library) -> list[str]:
    """``library ls``: per target and kernel class, how many schedules each source holds."""
    lines = []
    for target in sorted(library.targets()):
        sources = library.for_target(target)
        total = sum(len(s.schedules) for s in sources)
        lines.append(f"target {target_label(target)}: {len(sources)} source(s), {total} schedules")
        classes: dict[str, dict[str, int]] = defaultdict(dict)
        for source in sources:
            for kernel_class, schedules in source.by_class().items():
                classes[kernel_class][source.name] = len(schedules)
        width = max((len(c) for c in classes), default=12)
        lines.append(f"  {'kernel class':<{width}}  schedules  sources")
        for kernel_class in sorted(classes):
            per = classes[kernel_class]
            names = ", ".join(f"{name} ({n})" for name, n in sorted(per.items()))
            lines.append(f"  {kernel_class:<{width}}  {sum(per.values()):>9}  {names}")
    if not lines:
        lines.append("the schedule library is empty")
    if library.skipped:
        lines.append(f"skipped {len(library.skipped)} unreadable source(s):")
        lines += [f"  {name}: {why}" for name, why in sorted(library.skipped.items())]
    return lines
