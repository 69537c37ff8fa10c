"""gradtune's TenSet-style dataset: programs sampled from MetaSchedule design spaces of the model
zoo's workloads, measured over TVM RPC on this machine, stored as TVM's own JSONDatabase.

On disk (``data/``, DVC-tracked), the two JSONDatabase files are gzip'd —
``database_workload.json.gz`` and ``database_tuning_record.json.gz`` — beside ``manifest.json``
(workload → models, kernel class, FLOPs; target, hardware, measurement settings, counts) and the
dataset card ``README.md``. Decompressed, each file is byte for byte what
``ms.database.JSONDatabase`` writes and reads; ``open_database`` does that decompression into a
cache and hands back a plain JSONDatabase.

Records are appended as they are measured (one gzip member per batch: gzip readers concatenate
members, so an append never rewrites what is there) and a killed collection resumes by counting
the records each workload already has. Failed builds or runs are *not* stored as records:
they are counted per workload in the manifest (with the first error), so every record in the
database is a valid measurement.
"""

from __future__ import annotations

import contextlib
import datetime
import gzip
import hashlib
import json
import logging
import math
import os
import platform
import shutil
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import GradtuneError

log = logging.getLogger(__name__)

# Set by a signal handler (costmodel_training/collect.py) to stop at the next batch boundary:
# a KeyboardInterrupt raised inside a TVM callback can come back as a TVM error and be lost.
STOP = threading.Event()

WORKLOADS = "database_workload.json"
RECORDS = "database_tuning_record.json"
MANIFEST = "manifest.json"
CARD = "README.md"
FORMAT = "gradtune-dataset/1"


# --------------------------------------------------------------------------- settings


@dataclass
class CollectSettings:
    """What to measure per workload (recorded in the manifest)."""

    random_per_workload: int = 96  # random decisions across all sketches
    evolutionary_per_workload: int = 32  # then a short evolutionary search (XGB-guided)
    batch_size: int = 16  # candidates built and measured together, committed together
    max_failures_per_workload: int = 64  # a workload that keeps failing is given up on
    builder_workers: int = 2
    # Some random programs (huge unrolls of a reduction) take minutes to compile; they are
    # counted as failures rather than allowed to stall the collection.
    build_timeout_sec: float = 30.0
    rpc_servers: int = 1
    number: int = 2
    repeat: int = 3
    min_repeat_ms: int = 10
    seed: int = 0

    @property
    def target_per_workload(self) -> int:
        return self.random_per_workload + self.evolutionary_per_workload


# --------------------------------------------------------------------------- workloads


@dataclass
class WorkloadInfo:
    """One distinct workload of the zoo (deduplicated by structural hash)."""

    key: str  # str(tvm_ffi.structural_hash(mod)): also the JSONDatabase's workload hash
    mod: Any = field(repr=False)
    kernel_class: str
    flops: float
    models: list[str] = field(default_factory=list)  # zoo model names
    instances: dict[str, str] = field(default_factory=dict)  # "model@bN" → task name
    weights: dict[str, int] = field(default_factory=dict)  # "model@bN" → calls per inference


def extract_workloads(
    entries: list[Any], target: Any, on_model: Callable[[str, int], None] | None = None
) -> list[WorkloadInfo]:
    """Import every (model, batch) of the zoo, extract its tasks and deduplicate them."""
    import tvm_ffi

    from .partition import extract, prepare
    from .zoo import import_model, model_tag

    by_key: dict[str, WorkloadInfo] = {}
    for entry in entries:
        for batch in entry.batches:
            mod, params = import_model(entry.model, batch)
            tag = model_tag(entry.model, batch)
            for task in extract(prepare(mod, params, target), target):
                key = str(tvm_ffi.structural_hash(task.mod))
                info = by_key.get(key)
                if info is None:
                    info = by_key[key] = WorkloadInfo(key, task.mod, task.kernel_class, task.flops)
                if entry.model not in info.models:
                    info.models.append(entry.model)
                info.instances[tag] = task.name
                info.weights[tag] = info.weights.get(tag, 0) + task.weight
            if on_model is not None:
                on_model(entry.model, batch)
    return list(by_key.values())


def prioritize(workloads: list[WorkloadInfo]) -> list[WorkloadInfo]:
    """Round-robin over operator families, largest FLOPs first within each.

    A collection capped at N workloads (or cut short) then covers every compute family the zoo
    has — convolutions would otherwise crowd out softmax and norms — and the heaviest, most
    schedule-sensitive kernels of each come first.
    """
    by_family: dict[str, list[WorkloadInfo]] = {}
    for info in sorted(workloads, key=lambda w: (-w.flops, w.key)):
        by_family.setdefault(family(info.kernel_class), []).append(info)
    order = [f for f in FAMILIES if f in by_family]
    out: list[WorkloadInfo] = []
    while any(by_family.get(f) for f in order):
        for f in order:
            if by_family.get(f):
                out.append(by_family[f].pop(0))
    # Elementwise / data-movement kernels last: their design spaces hold a handful of programs
    # (an unroll choice), so they cannot reach the per-workload goal and teach little.
    return out + by_family.get(OTHER, [])


FAMILIES = ("conv2d", "conv2d_transpose", "conv3d", "matmul", "softmax", "norm", "mean")
OTHER = "elementwise / data movement"


def family(kernel_class: str) -> str:
    """Operator family of a kernel class (``conv2d+subtract+...+relu`` → ``conv2d``)."""
    for name in ("conv3d", "conv2d_transpose", "conv2d", "matmul", "softmax"):
        if name in kernel_class:
            return name
    if "norm" in kernel_class or "rsqrt" in kernel_class:  # layer norm, RMS norm
        return "norm"
    if "mean" in kernel_class:
        return "mean"
    return OTHER


# --------------------------------------------------------------------------- gzip files


def _gzip_lines(path: Path) -> tuple[list[bytes], str]:
    """Lines of a (possibly multi-member, possibly truncated) gzip file.

    A collection killed mid-append can leave a torn last member: what decompresses is kept,
    the rest is reported as the returned reason (empty when the file is whole).
    """
    data = path.read_bytes()
    out, reason = bytearray(), ""
    while data:
        inflater = zlib.decompressobj(zlib.MAX_WBITS | 16)
        try:
            out += inflater.decompress(data)
        except zlib.error as err:
            reason = f"{path.name}: corrupt gzip data ({err})"
            break
        if not inflater.eof:
            reason = f"{path.name}: truncated gzip member"
            break
        data = inflater.unused_data
    lines = bytes(out).split(b"\n")
    if reason and lines and lines[-1]:
        lines.pop()  # the torn line: never half a record
    return [line for line in lines if line.strip()], reason


def _read_lines(data_dir: Path, name: str) -> tuple[list[bytes], str]:
    gz, plain = data_dir / f"{name}.gz", data_dir / name
    if gz.is_file():
        return _gzip_lines(gz)
    if plain.is_file():
        return [line for line in plain.read_bytes().split(b"\n") if line.strip()], ""
    return [], ""


def _append_gz(path: Path, payload: bytes) -> None:
    """Append one gzip member and make it durable before the caller counts it as stored."""
    if not payload:
        return
    with open(path, "ab") as f:
        f.write(gzip.compress(payload, mtime=0))
        f.flush()
        os.fsync(f.fileno())


def _write_gz(path: Path, lines: list[bytes]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(gzip.compress(b"".join(line + b"\n" for line in lines), 6, mtime=0))
    os.replace(tmp, path)


# --------------------------------------------------------------------------- loading


@dataclass
class Skipped:
    """Bad input dropped while loading: how much, and the first reason (for one clear line)."""

    count: int = 0
    first_reason: str = ""
    reasons: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, reason: str, n: int = 1) -> None:
        self.count += n
        self.reasons[kind] = self.reasons.get(kind, 0) + n
        self.first_reason = self.first_reason or reason


def _target_mismatch(record_target: Any, expected: dict[str, Any]) -> str:
    """Why a record's target is not ``expected`` (empty when it is): kind, CPU, cores, arch."""
    if not isinstance(record_target, dict):
        return "its target is not a JSON object"
    for attr in ("kind", "mcpu", "num-cores", "arch"):
        if attr in expected and str(record_target.get(attr)) != str(expected[attr]):
            return f"target {attr}={record_target.get(attr)!r}, expected {expected[attr]!r}"
    return ""


def clean_lines(
    workload_lines: list[bytes],
    record_lines: list[bytes],
    target: dict[str, Any] | None,
    skipped: Skipped,
    replay: bool = False,
) -> tuple[list[bytes], list[bytes], list[str]]:
    """Keep what TVM can load: parseable workloads, records that name a kept workload, have a
    record's shape, and (when ``target`` is given) were measured on it. Workloads are
    re-indexed densely.

    ``replay`` also rebuilds every record as TVM will (its trace replayed on the workload,
    ~8 ms each): callers do that only when TVM refused the cheaply checked lines.

    Returns (workload lines, record lines, workload keys in line order).
    """
    from tvm.s_tir import meta_schedule as ms

    new_index: dict[int, int] = {}
    workloads: list[bytes] = []
    keys: list[str] = []
    parsed: list[Any] = []
    for i, line in enumerate(workload_lines):
        try:
            obj = json.loads(line)
            workload = ms.database.Workload.from_json(obj)
        except Exception as err:
            skipped.add("corrupt workload", f"workload line {i + 1} does not parse ({_short(err)})")
            continue
        new_index[i] = len(workloads)
        workloads.append(line)
        keys.append(str(obj[0]))
        parsed.append(workload)
    records: list[bytes] = []
    for i, line in enumerate(record_lines):
        try:
            obj = json.loads(line)
            if not (isinstance(obj, list) and len(obj) == 2 and isinstance(obj[0], int)):
                raise ValueError("not [workload_index, record]")
        except ValueError as err:
            skipped.add("corrupt record", f"record line {i + 1} does not parse ({_short(err)})")
            continue
        if obj[0] not in new_index:
            skipped.add(
                "missing workload", f"record line {i + 1} names workload {obj[0]}, which is missing"
            )
            continue
        body = obj[1]
        if target is not None and isinstance(body, list) and len(body) > 2:
            why = _target_mismatch(body[2], target)
            if why:
                skipped.add("other target", f"record line {i + 1} is for another target ({why})")
                continue
        why = _record_shape_error(body)
        if why:
            skipped.add("corrupt record", f"record line {i + 1} is not a record ({why})")
            continue
        if replay:
            try:
                ms.database.TuningRecord.from_json(body, parsed[new_index[obj[0]]])
            except Exception as err:
                skipped.add(
                    "corrupt record", f"record line {i + 1} does not replay ({_short(err)})"
                )
                continue
        if new_index[obj[0]] != obj[0]:
            line = json.dumps([new_index[obj[0]], body]).encode()
        records.append(line)
    return workloads, records, keys


def _record_shape_error(body: Any) -> str:
    """Why ``body`` is not ``[[insts, decisions], run_secs, target, args_info]`` ('' if it is)."""
    if not (isinstance(body, list) and len(body) == 4):
        return "not [trace, run_secs, target, args_info]"
    trace, run_secs, target, args_info = body
    if not (
        isinstance(trace, list) and len(trace) == 2 and all(isinstance(t, list) for t in trace)
    ):
        return "its trace is not [instructions, decisions]"
    if not (isinstance(run_secs, list) and run_secs):
        return "no run_secs"
    if not all(isinstance(x, int | float) and math.isfinite(x) and x > 0 for x in run_secs):
        return "run_secs are not positive finite numbers"
    if not isinstance(target, dict) or "kind" not in target:
        return "its target is not a target object"
    if not isinstance(args_info, list):
        return "its args_info is not a list"
    return ""


def _short(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return (text[-1] if text else type(err).__name__)[:200]


def _cache_root() -> Path:
    return Path(os.environ.get("GRADTUNE_CACHE", Path.home() / ".cache" / "gradtune")) / "datasets"


def _fingerprint(data_dir: Path, target: dict[str, Any] | None) -> str:
    digest = hashlib.sha256(json.dumps(target, sort_keys=True).encode())
    for name in (WORKLOADS, RECORDS):
        for path in (data_dir / f"{name}.gz", data_dir / name):
            if path.is_file():
                digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()[:24]


def report_skipped(skipped: Skipped, where: str) -> None:
    if skipped.count:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(skipped.reasons.items()))
        print(
            f"gradtune: skipped {skipped.count} bad line(s) in {where} ({kinds}); first: "
            f"{skipped.first_reason}",
            file=sys.stderr,
        )


def open_database(
    path: str | Path,
    target: dict[str, Any] | None = None,
    skipped: Skipped | None = None,
    cache_dir: str | Path | None = None,
) -> Any:
    """A plain ``ms.database.JSONDatabase`` of the dataset at ``path``.

    ``path`` is a dataset directory holding the gzip'd (or plain) JSONDatabase files. Corrupt or
    truncated lines, records whose workload is missing and — given ``target`` — records measured
    on another target are skipped, counted in ``skipped`` and reported in one line on stderr.
    The cleaned, decompressed copy is cached by content, so reopening is cheap.
    Raises ``GradtuneError`` when nothing usable remains.
    """
    data_dir = Path(path)
    skipped = skipped if skipped is not None else Skipped()
    if not data_dir.is_dir():
        raise GradtuneError(f"dataset directory not found: {data_dir}")
    root = Path(cache_dir) if cache_dir else _cache_root()
    out = root / _fingerprint(data_dir, target)
    database = None
    if not (out / "skipped.json").is_file():
        _prepare(data_dir, target, out, replay=False)
        try:
            database = _load(out) if (out / RECORDS).stat().st_size else None
        except Exception:
            # TVM rebuilds every record by replaying its trace, and one bad trace fails the
            # whole load: only then is the slower per-record replay check worth paying for.
            _prepare(data_dir, target, out, replay=True)
    done = json.loads((out / "skipped.json").read_text())
    skipped.count, skipped.first_reason = done["count"], done["first_reason"]
    skipped.reasons = done["reasons"]
    report_skipped(skipped, str(data_dir))
    if (out / RECORDS).stat().st_size == 0:
        because = (
            f"; every line was skipped, first: {skipped.first_reason}" if skipped.count else ""
        )
        raise GradtuneError(f"{data_dir}: the dataset holds no usable tuning records{because}")
    return database if database is not None else _load(out)


def _prepare(data_dir: Path, target: dict[str, Any] | None, out: Path, replay: bool) -> None:
    """Write the cleaned, decompressed copy of ``data_dir`` to ``out`` (atomically)."""
    workload_lines, why_w = _read_lines(data_dir, WORKLOADS)
    record_lines, why_r = _read_lines(data_dir, RECORDS)
    skipped = Skipped()
    for why in (why_w, why_r):
        if why:
            skipped.add("truncated file", why)
    workloads, records, _ = clean_lines(workload_lines, record_lines, target, skipped, replay)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / WORKLOADS).write_bytes(b"".join(line + b"\n" for line in workloads))
    (tmp / RECORDS).write_bytes(b"".join(line + b"\n" for line in records))
    (tmp / "skipped.json").write_text(json.dumps(asdict(skipped)))
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)


def _load(folder: Path) -> Any:
    from tvm.s_tir import meta_schedule as ms

    return ms.database.JSONDatabase(
        path_workload=str(folder / WORKLOADS),
        path_tuning_record=str(folder / RECORDS),
        allow_missing=False,
        module_equality="structural",
    )


# --------------------------------------------------------------------------- the store


class DatasetStore:
    """The dataset directory, opened for appending.

    Measuring commits into a plain JSONDatabase in a scratch directory (TVM writes the exact
    lines), and every line TVM appends there is mirrored, gzip'd, into ``data_dir``. Opening
    rewrites ``data_dir``'s files from the cleaned scratch copy, so a torn tail left by a kill
    is repaired before anything is appended after it.
    """

    def __init__(self, data_dir: Path, target: dict[str, Any], scratch: Path | None = None):

        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.target = target
        workload_lines, why_w = _read_lines(self.data_dir, WORKLOADS)
        record_lines, why_r = _read_lines(self.data_dir, RECORDS)
        self.scratch = scratch or (_cache_root() / "collect" / _path_id(self.data_dir))
        for replay in (False, True):  # replay each record only if TVM refuses the lines
            self.skipped = Skipped()
            for why in (why_w, why_r):
                if why:
                    self.skipped.add("truncated file", why)
            workloads, records, keys = clean_lines(
                workload_lines, record_lines, target, self.skipped, replay
            )
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch.mkdir(parents=True)
            for name, lines in ((WORKLOADS, workloads), (RECORDS, records)):
                (self.scratch / name).write_bytes(b"".join(line + b"\n" for line in lines))
            try:
                self.database = _load(self.scratch)
                break
            except Exception:
                if replay:
                    raise
        report_skipped(self.skipped, str(self.data_dir))
        for name, lines in ((WORKLOADS, workloads), (RECORDS, records)):
            _write_gz(self.data_dir / f"{name}.gz", lines)
            plain = self.data_dir / name
            if plain.exists():  # the gzip'd copy is now the dataset's one source of truth
                plain.unlink()
        self.offsets = {name: (self.scratch / name).stat().st_size for name in (WORKLOADS, RECORDS)}
        # Valid records per workload key, and their traces (to skip duplicates on resume).
        self.counts: dict[str, int] = {}
        self.traces: dict[str, set[str]] = {}
        for line in records:
            index, body = json.loads(line)
            key = keys[index]
            self.counts[key] = self.counts.get(key, 0) + 1
            self.traces.setdefault(key, set()).add(_json_key(body[0]))

    def workload(self, mod: Any) -> Any:
        workload = self.database.commit_workload(mod)
        self._mirror()
        return workload

    def commit(self, key: str, records: list[Any]) -> None:
        for record in records:
            self.database.commit_tuning_record(record)
        self._mirror()
        self.counts[key] = self.counts.get(key, 0) + len(records)

    def _mirror(self) -> None:
        for name in (WORKLOADS, RECORDS):
            path = self.scratch / name
            with open(path, "rb") as f:
                f.seek(self.offsets[name])
                new = f.read()
            _append_gz(self.data_dir / f"{name}.gz", new)
            self.offsets[name] += len(new)


def _path_id(path: Path) -> str:
    return hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:16]


def trace_key(trace: Any) -> str:
    """A trace as its record stores it (instructions + decisions, canonical JSON): the same
    program sampled twice, or sampled again after a restart, compares equal."""
    return _json_key(_to_py(trace.as_json(remove_postproc=False)))


def _json_key(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def _to_py(obj: Any) -> Any:
    """TVM FFI containers → plain Python (lists, dicts, numbers, strings)."""
    if isinstance(obj, bool):
        return int(obj)  # TVM writes booleans as 0/1 in the database
    if isinstance(obj, str | int | float) or obj is None:
        return obj
    if hasattr(obj, "items"):
        return {str(k): _to_py(v) for k, v in obj.items()}
    if hasattr(obj, "__len__") and hasattr(obj, "__getitem__"):
        return [_to_py(x) for x in obj]
    if hasattr(obj, "value"):
        return obj.value
    return str(obj)


# --------------------------------------------------------------------------- measuring


@dataclass
class WorkloadProgress:
    valid: int = 0
    failed: int = 0
    first_error: str = ""
    exhausted: bool = False  # the design space ran out of new programs


class PooledBuilder:
    """gradtune's fast build in a worker pool that outlives one batch.

    MetaSchedule's LocalBuilder starts a fresh pool per batch (against a worker memory leak);
    each new worker imports TVM, which on a loaded 2-core machine cost more than the builds of
    a 16-candidate batch. Recycling the pool every ``recycle`` batches keeps the leak bounded.
    """

    def __init__(self, max_workers: int, timeout_sec: float = 60.0, recycle: int = 25):
        self.max_workers, self.timeout_sec, self.recycle = max_workers, timeout_sec, recycle
        self._pool: Any = None
        self._uses = 0

    def build(self, inputs: list[Any]) -> list[Any]:
        from tvm.s_tir.meta_schedule.builder import BuilderResult
        from tvm.s_tir.meta_schedule.builder.local_builder import _worker_func
        from tvm.support.popen_pool import PopenPoolExecutor, StatusKind

        from .measure.builder import fast_build

        if self._pool is None or self._uses >= self.recycle:
            self.shutdown()
            self._pool = PopenPoolExecutor(max_workers=self.max_workers, timeout=self.timeout_sec)
        self._uses += 1
        results = []
        jobs = [(fast_build, None, b.mod, b.target, None) for b in inputs]
        for res in self._pool.map_with_error_catching(lambda x: _worker_func(*x), jobs):
            if res.status == StatusKind.COMPLETE:
                results.append(BuilderResult(res.value, None))
            elif res.status == StatusKind.TIMEOUT:
                results.append(BuilderResult(None, f"build timed out after {self.timeout_sec} s"))
            else:
                results.append(BuilderResult(None, f"build raised: {res.value}"))
        return results

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
            self._uses = 0


class Collector:
    """Samples, builds and measures candidates of each workload into a ``DatasetStore``."""

    def __init__(self, store: DatasetStore, target: Any, tracker: Any, settings: CollectSettings):
        from .measure.runner import MeasureSettings, make_rpc_runner
        from .tvm_compat import register_tensor_intrinsics

        register_tensor_intrinsics(target.kind.name)
        self.store = store
        self.target = target
        self.settings = settings
        self.measure = MeasureSettings(
            number=settings.number, repeat=settings.repeat, min_repeat_ms=settings.min_repeat_ms
        )
        self.builder = PooledBuilder(settings.builder_workers, settings.build_timeout_sec)
        self.runner = make_rpc_runner(tracker, self.measure, max_workers=settings.rpc_servers)

    def close(self) -> None:
        self.runner.pool.shutdown()
        self.builder.shutdown()

    def _context(self, info: WorkloadInfo, strategy: Any, salt: int) -> Any:
        from tvm.s_tir import meta_schedule as ms

        seed = (self.settings.seed * 1_000_003 + int(info.key) % 1_000_000 + salt) % (2**31 - 1)
        return ms.TuneContext(
            mod=info.mod,
            target=self.target,
            space_generator="post-order-apply",
            search_strategy=strategy,
            task_name=f"w{info.key}",
            rand_state=max(1, seed),
            num_threads=int(self.target.attrs.get("num-cores", 1)),
        )

    def run_workload(
        self,
        info: WorkloadInfo,
        phase: str,
        goal: int,
        state: WorkloadProgress,
        on_batch: Callable[[int], None] | None = None,
    ) -> None:
        """Measure until ``info`` holds ``goal`` valid records (or fails / runs out of programs).

        ``phase`` is ``random`` (ReplayTrace: random decisions across every sketch, a random
        cost model) or ``evolutionary`` (MetaSchedule's EvolutionarySearch seeded with the best
        measured programs and an XGBModel trained on this workload's records).
        """
        from tvm.s_tir import meta_schedule as ms

        need = goal - self.store.counts.get(info.key, 0)
        if need <= 0 or state.exhausted:
            return
        if phase == "random":
            strategy = ms.search_strategy.ReplayTrace(max_fail_count=20)
            cost_model = ms.cost_model.RandomModel(seed=self.settings.seed + 1)
        else:
            # A small population and two generations: ~10 s per search here instead of ~60 s
            # with the defaults; seeded with the best measured programs.
            strategy = ms.search_strategy.EvolutionarySearch(
                population_size=128, init_min_unmeasured=32, genetic_num_iters=2
            )
            cost_model = ms.cost_model.XGBModel(num_warmup_samples=0, adaptive_training=False)
        salt = self.store.counts.get(info.key, 0) + state.failed
        ctx = self._context(info, strategy, salt)
        workload = self.store.workload(info.mod)
        if phase == "evolutionary":
            self._warm_start(ctx, cost_model, workload)
        seen = self.store.traces.setdefault(info.key, set())
        # The evolutionary phase asks for its whole share in one search: each search costs
        # 10-20 s here (population sampling + 2 generations), more than measuring a batch.
        batch = self.settings.batch_size if phase == "random" else max(1, need)
        # Duplicates are dropped, so ask for more than needed; stop when the space runs dry.
        ctx.pre_tuning(
            max_trials=need * 4 + batch,
            num_trials_per_iter=batch,
            database=self.store.database,
            cost_model=cost_model,
        )
        dry_batches = 0
        try:
            while self.store.counts.get(info.key, 0) < goal and not STOP.is_set():
                if state.failed >= self.settings.max_failures_per_workload:
                    break
                candidates = ctx.search_strategy.generate_measure_candidates()
                if not candidates:
                    state.exhausted = phase == "random"
                    break
                fresh = []
                for cand in candidates:
                    k = trace_key(cand.sch.trace)
                    if k not in seen:
                        seen.add(k)
                        fresh.append(cand)
                room = goal - self.store.counts.get(info.key, 0)
                fresh = fresh[:room]
                if not fresh:
                    dry_batches += 1
                    # ReplayTrace never stops by itself on a tiny design space.
                    if dry_batches >= 5:
                        state.exhausted = phase == "random"
                        break
                    ctx.search_strategy.notify_runner_results(candidates, [])
                    continue
                dry_batches = 0
                results = self._measure(fresh)
                records = []
                for cand, result in zip(fresh, results, strict=True):
                    if result.error_msg is None and result.run_secs:
                        records.append(
                            ms.database.TuningRecord(
                                trace=cand.sch.trace,
                                workload=workload,
                                run_secs=[float(s) for s in result.run_secs],
                                target=self.target,
                                args_info=cand.args_info,
                            )
                        )
                    else:
                        state.failed += 1
                        state.first_error = state.first_error or _short_error(result.error_msg)
                self.store.commit(info.key, records)
                state.valid = self.store.counts.get(info.key, 0)
                ctx.search_strategy.notify_runner_results(fresh, results)
                cost_model.update(ctx, fresh, results)
                if on_batch is not None:
                    on_batch(len(fresh))
        finally:
            ctx.search_strategy.post_tuning()

    def _measure(self, candidates: list[Any]) -> list[Any]:
        """Build locally, run over RPC; a build failure becomes a failed RunnerResult."""
        from tvm.s_tir import meta_schedule as ms

        t0 = time.perf_counter()
        built = self.builder.build(
            [ms.builder.BuilderInput(c.sch.mod, self.target) for c in candidates]
        )
        t1 = time.perf_counter()
        inputs, where = [], []
        results: list[Any] = [None] * len(candidates)
        for i, (cand, b) in enumerate(zip(candidates, built, strict=True)):
            if b.error_msg is not None:
                results[i] = ms.runner.RunnerResult(None, f"build: {b.error_msg}")
                continue
            inputs.append(ms.runner.RunnerInput(b.artifact_path, "cpu", cand.args_info))
            where.append(i)
        try:
            futures = self.runner.run(inputs) if inputs else []
            for i, future in zip(where, futures, strict=True):
                results[i] = future.result()
            log.debug(
                "batch of %d: build %.1f s, run %.1f s",
                len(candidates),
                t1 - t0,
                time.perf_counter() - t1,
            )
        finally:
            for b in built:
                if b.artifact_path:
                    shutil.rmtree(os.path.dirname(b.artifact_path), ignore_errors=True)
        return results

    def _warm_start(self, ctx: Any, cost_model: Any, workload: Any) -> None:
        """Train the XGBModel on the workload's measured records before the search uses it."""
        from tvm.s_tir import meta_schedule as ms

        records = self.store.database.get_top_k(workload, 100_000)
        candidates, results = [], []
        for record in records:
            try:
                candidates.append(record.as_measure_candidate())
            except Exception:  # a trace that no longer applies teaches nothing
                continue
            results.append(ms.runner.RunnerResult(list(record.run_secs), None))
        if len(candidates) >= 2:
            cost_model.update(ctx, candidates, results)


def _short_error(msg: str | None) -> str:
    lines = [line for line in (msg or "unknown error").strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "unknown error")[:300]


# --------------------------------------------------------------------------- manifest + card


def hardware() -> dict[str, Any]:
    import psutil

    model = platform.processor() or ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "cpu_model": model,
        "physical_cores": psutil.cpu_count(logical=False),
        "logical_cores": psutil.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "machine": platform.machine(),
        "system": f"{platform.system()} {platform.release()}",
    }


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def write_manifest(
    data_dir: Path,
    workloads: list[WorkloadInfo],
    progress: dict[str, WorkloadProgress],
    target_config: dict[str, Any],
    settings: CollectSettings,
    started: str,
    seconds: float,  # collection time so far, earlier runs included
) -> dict[str, Any]:
    import tvm

    from .measure.runner import MeasureSettings

    path = data_dir / MANIFEST
    old = json.loads(path.read_text()) if path.is_file() else {}
    measure = asdict(MeasureSettings(settings.number, settings.repeat, settings.min_repeat_ms))
    manifest = {
        "format": FORMAT,
        "target": target_config,
        "hardware": hardware(),
        "tvm_version": tvm.__version__,
        "measurement": {
            **measure,
            "runner": "MetaSchedule RPCRunner over a local TVM RPC tracker",
            "rpc_servers": settings.rpc_servers,
            "builder": "LocalBuilder with gradtune's fast_build",
            "builder_workers": settings.builder_workers,
            "build_timeout_sec": settings.build_timeout_sec,
            "latency": "run_secs holds `repeat` means of `number` runs each",
        },
        "sampling": {
            "random_per_workload": settings.random_per_workload,
            "evolutionary_per_workload": settings.evolutionary_per_workload,
            "batch_size": settings.batch_size,
            "seed": settings.seed,
            "failures": "not stored as records; counted per workload below",
        },
        "created": old.get("created", started),
        "updated": _now(),
        "collection_seconds": round(seconds, 1),
        "workloads": {},
    }
    for info in workloads:
        state = progress.get(info.key, WorkloadProgress())
        manifest["workloads"][info.key] = {
            "models": info.models,
            "instances": info.instances,
            "weights": info.weights,
            "kernel_class": info.kernel_class,
            "flops": info.flops,
            "records": state.valid,
            "failed": state.failed,
            "first_error": state.first_error,
            "exhausted": state.exhausted,
        }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=False) + "\n")
    os.replace(tmp, path)
    return manifest


def load_manifest(data_dir: Path) -> dict[str, Any]:
    path = Path(data_dir) / MANIFEST
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise GradtuneError(f"{path} is not valid JSON: {err}") from None


# --------------------------------------------------------------------------- the collection


def collect(
    data_dir: str | Path,
    zoo_config: str | Path,
    target_config: dict[str, Any],
    settings: CollectSettings,
    tracker: Any | None = None,
    max_workloads: int | None = None,
    time_budget: float | None = None,
    console: Any = None,
) -> dict[str, Any]:
    """Measure the zoo's workloads into ``data_dir`` until each holds its target count.

    Resumable: what is already stored counts, only the missing records are measured. Returns
    the manifest. ``tracker=None`` starts a local RPC fleet for the duration.
    """
    from rich.console import Console

    from .measure.rpc_fleet import LocalFleet
    from .target import make_target
    from .zoo import load_config

    console = console or Console(stderr=True)
    data_dir = Path(data_dir)
    target = make_target(target_config)
    entries = load_config(zoo_config)
    started, t0 = _now(), time.perf_counter()
    with console.status("importing the zoo and extracting tasks"):
        every = prioritize(extract_workloads(entries, target))
    workloads = every[:max_workloads] if max_workloads is not None else every
    selected = {w.key for w in workloads}
    console.print(
        f"{len(workloads)} distinct workloads from {sum(len(e.batches) for e in entries)} "
        f"zoo models; target {json.dumps(target_config)}"
    )
    store = DatasetStore(data_dir, target_config)
    previous = load_manifest(data_dir)
    manifest = previous.get("workloads", {})
    spent = float(previous.get("collection_seconds", 0.0))
    progress = {}
    for info in every:
        old = manifest.get(info.key, {})
        progress[info.key] = WorkloadProgress(
            valid=store.counts.get(info.key, 0),
            failed=int(old.get("failed", 0)),
            first_error=str(old.get("first_error", "")),
            exhausted=bool(old.get("exhausted", False)),
        )

    def save() -> dict[str, Any]:
        # Every selected workload, and any other the database holds records of (an earlier,
        # differently capped collection): the manifest describes the whole database.
        listed = [w for w in every if w.key in selected or store.counts.get(w.key)]
        for w in listed:
            progress[w.key].valid = store.counts.get(w.key, 0)
        return write_manifest(
            data_dir, listed, progress, target_config, settings, started,
            spent + time.perf_counter() - t0,
        )  # fmt: skip

    with contextlib.ExitStack() as stack:
        if tracker is None:
            tracker = stack.enter_context(LocalFleet(num_servers=settings.rpc_servers))
        collector = Collector(store, target, tracker, settings)
        stack.callback(collector.close)
        plan = [
            ("random", settings.random_per_workload),
            ("evolutionary", settings.target_per_workload),
        ]
        missing = sum(
            max(0, settings.target_per_workload - store.counts.get(w.key, 0))
            for w in workloads
            if not progress[w.key].exhausted
        )
        console.print(f"{missing} candidates to measure ({len(store.database)} already stored)")
        # Workload by workload (random, then evolutionary), in priority order: a collection cut
        # short holds complete workloads of the most important families.
        with _progress(console) as bar:
            job = bar.add_task("measuring", total=missing)
            for n, info in enumerate(workloads, 1):
                if STOP.is_set():
                    break
                if time_budget is not None and time.perf_counter() - t0 > time_budget:
                    break
                for phase, goal in plan:
                    if STOP.is_set():
                        break
                    state = progress[info.key]
                    before = store.counts.get(info.key, 0)
                    if before >= goal or state.exhausted:
                        continue
                    bar.update(
                        job, description=f"{phase} {n}/{len(workloads)} {info.kernel_class[:40]}"
                    )
                    t_w = time.perf_counter()
                    collector.run_workload(
                        info, phase, goal, state, on_batch=lambda k: bar.advance(job, k)
                    )
                    write_card(data_dir, save())
                    log.info(
                        "%s %s [%s] %d -> %d records (%d failed%s) in %.0f s; total %d",
                        phase, info.key, info.kernel_class, before, state.valid, state.failed,
                        ", design space exhausted" if state.exhausted else "",
                        time.perf_counter() - t_w, len(store.database),
                    )  # fmt: skip
    result = save()
    write_card(data_dir, result)
    return result


@contextlib.contextmanager
def _progress(console: Any) -> Iterator[Any]:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), TimeRemainingColumn(), console=console,
    ) as bar:  # fmt: skip
        yield bar


# --------------------------------------------------------------------------- info + card


def latencies_by_workload(data_dir: Path) -> dict[str, list[float]]:
    """Median latency (seconds) of every valid record, per workload key (no TVM needed)."""
    workload_lines, _ = _read_lines(data_dir, WORKLOADS)
    record_lines, _ = _read_lines(data_dir, RECORDS)
    keys = []
    for line in workload_lines:
        try:
            keys.append(str(json.loads(line)[0]))
        except (ValueError, IndexError, TypeError):
            keys.append("")
    out: dict[str, list[float]] = {}
    for line in record_lines:
        try:
            index, body = json.loads(line)
            secs = sorted(float(s) for s in body[1])
            key = keys[index]
        except (ValueError, IndexError, TypeError):
            continue
        if secs and key:
            out.setdefault(key, []).append(secs[len(secs) // 2])
    return out


def summarize(data_dir: str | Path) -> dict[str, Any]:
    """Counts and latency statistics of a dataset directory (for ``dataset info`` and the card)."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise GradtuneError(f"dataset directory not found: {data_dir}")
    manifest = load_manifest(data_dir)
    lat = latencies_by_workload(data_dir)
    records = sum(len(v) for v in lat.values())
    if not manifest and not records:
        raise GradtuneError(f"{data_dir}: no dataset here (no manifest.json, no records)")
    entries = manifest.get("workloads", {})
    goal = (manifest.get("sampling", {}).get("random_per_workload", 0)
            + manifest.get("sampling", {}).get("evolutionary_per_workload", 0))  # fmt: skip
    families: dict[str, dict[str, Any]] = {}
    for key, entry in entries.items():
        fam = family(entry.get("kernel_class", "?"))
        f = families.setdefault(fam, {"workloads": 0, "records": 0, "speedups": []})
        f["workloads"] += 1
        f["records"] += len(lat.get(key, []))
        values = lat.get(key, [])
        if len(values) >= 2:
            f["speedups"].append(sorted(values)[len(values) // 2] / min(values))
    return {
        "workloads": len(entries) or len(lat),
        "workloads_with_records": len(lat),
        "workloads_complete": sum(1 for k in entries if goal and len(lat.get(k, [])) >= goal),
        "records": records,
        "failed": sum(int(e.get("failed", 0)) for e in entries.values()),
        "goal_per_workload": goal,
        "models": sorted({m for e in entries.values() for m in e.get("models", [])}),
        "families": {
            name: {
                "workloads": f["workloads"],
                "records": f["records"],
                "median_over_best": round(_median(f["speedups"]), 2) if f["speedups"] else None,
            }
            for name, f in sorted(families.items())
        },
        "target": manifest.get("target"),
        "hardware": manifest.get("hardware"),
        "measurement": manifest.get("measurement"),
        "collection_seconds": manifest.get("collection_seconds"),
        "evolutionary": _evolutionary_gain(lat, manifest),
        "updated": manifest.get("updated"),
    }


def _evolutionary_gain(lat: dict[str, list[float]], manifest: dict[str, Any]) -> dict[str, Any]:
    """How much the evolutionary share adds over random sampling, per workload that has both.

    A workload's evolutionary phase starts only once it holds ``random_per_workload`` records,
    so its first that many records (in file order) are the random ones, whatever restarts
    happened in between.
    """
    n_random = int(manifest.get("sampling", {}).get("random_per_workload", 0) or 0)
    ratios, best_is_evo = [], 0
    for values in lat.values():
        if not n_random or len(values) <= n_random:
            continue
        best_random, best_evo = min(values[:n_random]), min(values[n_random:])
        ratios.append(best_random / min(best_random, best_evo))
        best_is_evo += best_evo < best_random
    return {
        "workloads": len(ratios),
        "best_found_by_evolutionary": best_is_evo,
        "median_best_random_over_best": round(_median(ratios), 3) if ratios else None,
        "max_best_random_over_best": round(max(ratios), 3) if ratios else None,
    }


def _median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2] if values else math.nan


def plot_latencies(data_dir: Path, out: Path) -> bool:
    """Per-family distribution of latency / best latency within each workload."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    manifest = load_manifest(data_dir).get("workloads", {})
    lat = latencies_by_workload(data_dir)
    groups: dict[str, list[float]] = {}
    for key, values in lat.items():
        best = min(values)
        fam = family(manifest.get(key, {}).get("kernel_class", ""))
        groups.setdefault(fam, []).extend(v / best for v in values if best > 0)
    if not groups:
        return False
    names = sorted(groups)
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.boxplot([groups[n] for n in names], whis=(5, 95), showfliers=False)
    ax.set_xticks(range(1, len(names) + 1), names, rotation=30, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("latency / best latency of its workload")
    ax.set_title("Spread of measured candidates per operator family (5–95 %)")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return True


def write_card(data_dir: str | Path, manifest: dict[str, Any] | None = None) -> Path:
    """``data/README.md``: what the dataset is, how it was measured, counts, distributions."""
    data_dir = Path(data_dir)
    s = summarize(data_dir)
    has_plot = plot_latencies(data_dir, data_dir / "latency_spread.png")
    m = s.get("measurement") or {}
    hw = s.get("hardware") or {}
    evo = s["evolutionary"]
    sampling = (manifest or load_manifest(data_dir)).get("sampling", {})
    lines = [
        "# gradtune TenSet-style dataset",
        "",
        "Programs sampled from TVM MetaSchedule design spaces of the workloads of gradtune's model",
        "zoo (`configs/zoo.yaml`, `gradtune/zoo.py`: small networks built in code with random",
        "weights), built and measured over TVM RPC on one machine. Generated by",
        "`gradtune dataset collect` from the data itself; do not edit by hand.",
        "",
        "## Contents",
        "",
        "- `database_workload.json.gz`, `database_tuning_record.json.gz`: TVM's JSONDatabase,",
        "  gzip'd (gunzip both and `ms.database.JSONDatabase(...)` reads them; or",
        "  `gradtune.dataset.open_database('data')`). Every record is a valid measurement.",
        "- `manifest.json`: per workload (key = structural hash) its models and instances,",
        "  kernel class, FLOPs, record and failure counts; the target, hardware and settings.",
        "",
        "## How it was measured",
        "",
        f"- Target: `{json.dumps(s.get('target'))}`",
        f"- Hardware: {hw.get('cpu_model', '?')}, {hw.get('physical_cores', '?')} physical / "
        f"{hw.get('logical_cores', '?')} logical cores, {hw.get('memory_gb', '?')} GB",
        f"- Builder: {m.get('builder', '?')}; runner: {m.get('runner', '?')} "
        f"({m.get('rpc_servers', '?')} server); number={m.get('number')}, "
        f"repeat={m.get('repeat')}, min_repeat_ms={m.get('min_repeat_ms')}, "
        f"cache flush {'on' if m.get('enable_cpu_cache_flush') else 'off'}",
        f"- Sampling per workload: {sampling.get('random_per_workload')}"
        " random programs (ReplayTrace over every sketch, random cost model), then up to "
        f"{sampling.get('evolutionary_per_workload')} from a short "
        "EvolutionarySearch (XGBModel trained on the workload's records) so that good programs "
        "are represented. Duplicate programs are not measured twice.",
        "- Failed builds/runs are not stored; they are counted per workload in the manifest.",
        "",
        "## Counts",
        "",
        f"- {s['workloads']} distinct workloads from {len(s['models'])} models "
        f"({', '.join(s['models'])}); {s['workloads_with_records']} have records, "
        f"{s['workloads_complete']} reached the goal of {s['goal_per_workload']}.",
        f"- {s['records']} measured records; {s['failed']} failed candidates (not stored).",
        f"- Collection time: {((s.get('collection_seconds') or 0) / 3600):.2f} h; last update "
        f"{s.get('updated')}.",
        "",
        "| operator family | workloads | records | median latency / best |",
        "|---|---:|---:|---:|",
    ]
    if evo["workloads"]:
        # Records come in file order, random share first: what the evolutionary share added.
        lines.insert(
            lines.index("## Counts") + 4,
            f"- Evolutionary share: the best program of {evo['best_found_by_evolutionary']} of "
            f"{evo['workloads']} workloads came from it; the best random program is "
            f"{evo['median_best_random_over_best']}× the best latency at the median, "
            f"{evo['max_best_random_over_best']}× at worst.",
        )
    for name, f in s["families"].items():
        lines.append(f"| {name} | {f['workloads']} | {f['records']} | {f['median_over_best']} |")
    lines += [""]
    if has_plot:
        lines += ["![latency spread](latency_spread.png)", ""]
    lines += [
        "The last column is, per workload, the median candidate's latency over the best one's",
        "(medians across the family): how much a good schedule matters there.",
        "",
    ]
    out = data_dir / CARD
    out.write_text("\n".join(lines))
    return out
