"""The dataset on disk: TVM's JSONDatabase files, gzip'd, read back cleaned.

``data/`` holds ``database_workload.json.gz`` and ``database_tuning_record.json.gz``.
Decompressed, each is byte for byte what ``ms.database.JSONDatabase`` writes and reads;
``open_dataset`` does that decompression into a cache and hands back a plain JSONDatabase.

Records are appended as they are measured (one gzip member per batch: gzip readers concatenate
members, so an append never rewrites what is there), and a kill can leave a torn last member.
So every read goes through ``clean_lines``: what TVM cannot load (a torn or corrupt line, a
record whose workload is missing, one measured on another target) is skipped and counted in a
``Skipped``, never fatal, because TVM's own loader fails whole on one bad line.

Beside them, ``record_machines.json`` (``machines``) says which machine measured each record
line; the store renumbers it whenever cleaning renumbers the lines, and ``open_dataset`` can
read the records of chosen machines only.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import shutil
import sys
import zlib
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import GradtuneError
from .hardware import describe, target_mismatch
from .machines import RecordMachines, load_record_machines, write_record_machines

WORKLOADS = "database_workload.json"
RECORDS = "database_tuning_record.json"
MACHINE_COUNTS = "machine_counts.json"  # in a cleaned copy: usable records per machine id


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


def read_lines(data_dir: Path, name: str) -> tuple[list[bytes], str]:
    """Non-empty lines of ``name`` (gzip'd, else plain) in ``data_dir``, and why the file was cut
    short ('' when whole); no lines when neither file exists."""
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


# --------------------------------------------------------------------------- cleaning


@dataclass
class Skipped:
    """Bad input dropped while loading: how much, and the first reason (for one clear line).

    One count runs from the dataset's lines to the cost model's featurizing of its records
    (a trace that no longer applies), so every stage reports skips the same way.
    """

    count: int = 0
    first_reason: str = ""
    reasons: dict[str, int] = field(default_factory=dict)  # kind → count

    def add(self, kind: str, reason: str, n: int = 1) -> None:
        self.count += n
        self.reasons[kind] = self.reasons.get(kind, 0) + n
        self.first_reason = self.first_reason or reason


def clean_lines(
    workload_lines: list[bytes],
    record_lines: list[bytes],
    target: dict[str, Any] | None,
    skipped: Skipped,
    replay: bool = False,
) -> tuple[list[bytes], list[bytes], list[str], list[int]]:
    """Keep what TVM can load: parseable workloads, records that name a kept workload, have a
    record's shape, and (when ``target`` is given) were measured on it. Workloads are
    re-indexed densely.

    ``replay`` also rebuilds every record as TVM will (its trace replayed on the workload,
    ~8 ms each): callers do that only when TVM refused the cheaply checked lines.

    Returns (workload lines, record lines, workload keys in line order, and for each kept
    record the index of its line in ``record_lines``: what ties it to its machine).
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
    origins: list[int] = []
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
            why = target_mismatch(body[2], target)
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
        origins.append(i)
    return workloads, records, keys, origins


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


def report_skipped(skipped: Skipped, where: str) -> None:
    """One line on stderr saying what was skipped in ``where`` (nothing when nothing was)."""
    if skipped.count:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(skipped.reasons.items()))
        print(
            f"gradtune: skipped {skipped.count} bad line(s) in {where} ({kinds}); first: "
            f"{skipped.first_reason}",
            file=sys.stderr,
        )


# --------------------------------------------------------------------------- opening


def _cache_root() -> Path:
    return Path(os.environ.get("GRADTUNE_CACHE", Path.home() / ".cache" / "gradtune")) / "datasets"


def _fingerprint(
    data_dir: Path,
    target: dict[str, Any] | None,
    attribution: RecordMachines,
    machines: Collection[str] | None,
) -> str:
    selection = sorted(machines) if machines is not None else None
    digest = hashlib.sha256(json.dumps([target, selection], sort_keys=True).encode())
    for name in (WORKLOADS, RECORDS):
        for path in (data_dir / f"{name}.gz", data_dir / name):
            if path.is_file():
                digest.update(path.name.encode() + path.read_bytes())
    # Which machine owns which line decides what a selection of machines holds.
    owners = [attribution.ranges, attribution.fallback, attribution.machines]
    digest.update(json.dumps(owners, sort_keys=True, default=str).encode())
    return digest.hexdigest()[:24]


def open_dataset(
    path: str | Path,
    target: dict[str, Any] | None = None,
    skipped: Skipped | None = None,
    cache_dir: str | Path | None = None,
    machines: Collection[str] | None = None,
) -> Any:
    """A plain ``ms.database.JSONDatabase`` of the dataset at ``path``.

    ``path`` is a dataset directory holding the gzip'd (or plain) JSONDatabase files. Corrupt or
    truncated lines, records whose workload is missing and — given ``target`` — records measured
    on another target are skipped, counted in ``skipped`` and reported in one line on stderr.
    Given ``machines`` (ids of ``machines.load_record_machines``), only the records those
    machines measured are read, and only their bad lines are counted; ``machine_counts`` says
    which machines the records come from. The cleaned, decompressed copy is cached by content,
    so reopening is cheap. Raises ``GradtuneError`` when nothing usable remains.
    """
    data_dir = Path(path)
    skipped = skipped if skipped is not None else Skipped()
    out, database = _cached_copy(data_dir, target, cache_dir, machines)
    done = json.loads((out / "skipped.json").read_text())
    skipped.count, skipped.first_reason = done["count"], done["first_reason"]
    skipped.reasons = done["reasons"]
    where = str(data_dir) + (f" (machines {', '.join(sorted(machines))})" if machines else "")
    report_skipped(skipped, where)
    if (out / RECORDS).stat().st_size == 0:
        because = (
            f"; every line was skipped, first: {skipped.first_reason}" if skipped.count else ""
        )
        raise GradtuneError(f"{where}: the dataset holds no usable tuning records{because}")
    return database if database is not None else _load(out)


def machine_counts(
    path: str | Path,
    target: dict[str, Any] | None = None,
    cache_dir: str | Path | None = None,
) -> dict[str, int]:
    """Usable records per machine id: of the records ``open_dataset(path, target)`` gives.
    Reads the cleaned copy that call caches (and makes it, if it was not made yet)."""
    out, _ = _cached_copy(Path(path), target, cache_dir, None)
    return json.loads((out / MACHINE_COUNTS).read_text())


def _cached_copy(
    data_dir: Path,
    target: dict[str, Any] | None,
    cache_dir: str | Path | None,
    machines: Collection[str] | None,
) -> tuple[Path, Any]:
    """The cleaned copy's directory, and the database when making it meant loading it."""
    if not data_dir.is_dir():
        raise GradtuneError(f"dataset directory not found: {data_dir}")
    attribution = load_record_machines(data_dir)
    root = Path(cache_dir) if cache_dir else _cache_root()
    out = root / _fingerprint(data_dir, target, attribution, machines)
    database = None
    if not (out / "skipped.json").is_file():
        _prepare(data_dir, target, attribution, machines, out, replay=False)
        try:
            database = _load(out) if (out / RECORDS).stat().st_size else None
        except Exception:
            # TVM rebuilds every record by replaying its trace, and one bad trace fails the
            # whole load: only then is the slower per-record replay check worth paying for.
            _prepare(data_dir, target, attribution, machines, out, replay=True)
    return out, database


def _prepare(
    data_dir: Path,
    target: dict[str, Any] | None,
    attribution: RecordMachines,
    machines: Collection[str] | None,
    out: Path,
    replay: bool,
) -> None:
    """Write the cleaned, decompressed copy of ``data_dir`` to ``out`` (atomically), with the
    records of ``machines`` only when given, and the usable records per machine."""
    workload_lines, why_w = read_lines(data_dir, WORKLOADS)
    record_lines, why_r = read_lines(data_dir, RECORDS)
    owners = attribution.per_line(len(record_lines))
    if machines is not None:
        chosen = set(machines)
        # A torn tail belongs to the machine of the last whole line (the session appending).
        if why_r and not (owners and owners[-1] in chosen):
            why_r = ""
        record_lines = [line for line, m in zip(record_lines, owners, strict=True) if m in chosen]
        owners = [m for m in owners if m in chosen]
    skipped = Skipped()
    for why in (why_w, why_r):
        if why:
            skipped.add("truncated file", why)
    workloads, records, _, origins = clean_lines(
        workload_lines, record_lines, target, skipped, replay
    )
    counts: dict[str, int] = {}
    for i in origins:
        counts[owners[i]] = counts.get(owners[i], 0) + 1
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / WORKLOADS).write_bytes(b"".join(line + b"\n" for line in workloads))
    (tmp / RECORDS).write_bytes(b"".join(line + b"\n" for line in records))
    (tmp / MACHINE_COUNTS).write_text(json.dumps(counts))
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
    """The dataset directory, opened for appending by one collection session.

    Measuring commits into a plain JSONDatabase in a scratch directory (TVM writes the exact
    lines), and every line TVM appends there is mirrored, gzip'd, into ``data_dir``. Opening
    rewrites ``data_dir``'s files from the cleaned scratch copy, so a torn tail left by a kill
    is repaired before anything is appended after it, and rewrites ``record_machines.json``
    to match: the earlier lines keep their machines, renumbered, and the session's ``machine``
    (this host's descriptor unless given) owns every line appended from here on.

    A dataset holding records measured for another target is refused, not cleaned: cleaning
    would delete another machine's measurements. Collect for another target into a directory
    of its own.
    """

    def __init__(
        self,
        data_dir: Path,
        target: dict[str, Any],
        scratch: Path | None = None,
        machine: dict[str, Any] | None = None,
    ):
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.target = target
        self.machine = machine if machine is not None else describe(target)
        attribution = load_record_machines(self.data_dir)
        workload_lines, why_w = read_lines(self.data_dir, WORKLOADS)
        record_lines, why_r = read_lines(self.data_dir, RECORDS)
        owners = attribution.per_line(len(record_lines))
        self.scratch = scratch or (_cache_root() / "collect" / _path_id(self.data_dir))
        for replay in (False, True):  # replay each record only if TVM refuses the lines
            self.skipped = Skipped()
            for why in (why_w, why_r):
                if why:
                    self.skipped.add("truncated file", why)
            workloads, records, keys, origins = clean_lines(
                workload_lines, record_lines, target, self.skipped, replay
            )
            other = self.skipped.reasons.get("other target", 0)
            if other:
                raise GradtuneError(
                    f"{self.data_dir} holds {other} record(s) measured for another target than "
                    f"{json.dumps(target)}; collect into another directory (--out)"
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
        # Right after the lines it numbers, and before anything is appended after them.
        self.machines = write_record_machines(
            self.data_dir, [owners[i] for i in origins], attribution.every(), self.machine
        )
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
