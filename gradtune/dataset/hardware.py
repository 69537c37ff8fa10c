"""What measured a record: a descriptor of the CPU, and a short id for it.

A latency is a fact about one machine. The cost model learns from latencies, so the dataset
records, for every record, the machine that measured it (``machines``), described by what
changes the performance of generated code: the CPU model and vendor, the ISA extensions that
change code generation (vector width, FMA, int8 dot products, matrix tiles), the cache sizes
that decide which tilings fit, the core counts, the maximum clock when the kernel reports it,
the TVM target the programs were compiled for (TVM 0.27 prints a target as this JSON), and the
threads TVM's runtime ran them on (``tvm_threads``). The last is not the target's
``num-cores``: a server sizes its pool from its own environment (TVM's default is half the
logical CPUs on x86), and a kernel's speed, and for kernels of a few µs even the order of two
programs, changes with it. A descriptor written before the count was recorded has none, and
its id is what it was.

Everything is read from ``/proc/cpuinfo`` and ``/sys/devices/system/cpu`` (x86 and Arm
layouts), so a missing or partial file leaves a field ``None`` instead of failing: containers
and VMs hide some of them. Memory size and the OS are recorded but are not part of the id:
they do not change how fast a kernel runs, and an OS upgrade must not split one machine's
records in two. A descriptor written before this module existed (the manifest's old
``hardware`` entry: CPU model and core counts only) keeps ``isa`` as ``None``: unknown, not
empty.
"""

from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path
from typing import Any

# ISA extensions that change what LLVM generates for a tensor program. x86 names as
# /proc/cpuinfo's "flags" spells them; Arm names as its "Features" line does (asimd is NEON).
CODEGEN_FLAGS = frozenset(
    {
        # x86: vector width and FMA, then int8 / bf16 / fp16 dot products, then AMX tiles
        "sse4_2", "avx", "avx2", "fma", "f16c",
        "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd",
        "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16",
        "amx_tile", "amx_int8", "amx_bf16", "amx_fp16",
        # Arm: NEON, dot products, int8 matrix multiply, half / bf16, scalable vectors
        "neon", "asimd", "asimddp", "asimdhp", "fphp", "i8mm", "bf16", "sve", "sve2",
    }
)  # fmt: skip

# The fields the id hashes: what the speed of a kernel depends on.
ID_FIELDS = (
    "vendor", "cpu_model", "machine", "isa", "caches", "physical_cores", "logical_cores",
    "max_mhz", "target", "devices",
)  # fmt: skip

# Arm's "CPU implementer" codes for the vendors one meets on servers and laptops.
ARM_IMPLEMENTERS = {
    "0x41": "ARM",
    "0x42": "Broadcom",
    "0x48": "HiSilicon",
    "0x4e": "NVIDIA",
    "0x51": "Qualcomm",
    "0x61": "Apple",
    "0xc0": "Ampere",
}


def describe(
    target: dict[str, Any] | None = None,
    proc: str | Path = "/proc",
    sys_cpu: str | Path = "/sys/devices/system/cpu",
    devices: str | None = None,
    threads: int | None = None,
) -> dict[str, Any]:
    """This machine's descriptor, for records measured with ``target`` (a target config) on
    ``threads`` of TVM's runtime threads (None: unknown).

    ``proc`` and ``sys_cpu`` are where ``cpuinfo`` and the per-CPU directories are read from
    (tests point them at a copy); a missing file leaves its fields ``None``. ``devices`` names
    the RPC tracker when the records are measured on devices behind one rather than on this
    host: TVM's RPC servers cannot be asked for their CPU, so the descriptor stays this host's,
    and the tracker, part of the id, keeps those records apart from the host's own.
    """
    entries = parse_cpuinfo(_read(Path(proc) / "cpuinfo"))
    first = entries[0] if entries else {}
    flags = set((first.get("flags") or first.get("Features") or "").split())
    logical, physical = _core_counts(entries)
    descriptor: dict[str, Any] = {
        "cpu_model": _model(first),
        "vendor": _vendor(first),
        "machine": platform.machine() or None,
        "isa": sorted(flags & CODEGEN_FLAGS) if flags else None,
        "caches": cache_sizes(Path(sys_cpu) / "cpu0" / "cache"),
        "physical_cores": physical,
        "logical_cores": logical,
        "max_mhz": _max_mhz(Path(sys_cpu) / "cpu0" / "cpufreq" / "cpuinfo_max_freq"),
        "memory_gb": _memory_gb(),
        "system": f"{platform.system()} {platform.release()}".strip() or None,
        "target": target,
        "devices": devices,
        "tvm_threads": threads,
    }
    descriptor["id"] = machine_id(descriptor)
    return descriptor


def machine_id(descriptor: dict[str, Any]) -> str:
    """12 hex digits of SHA-256 over the descriptor's ``ID_FIELDS`` (missing ones as null):
    the same machine and target give the same id in every run and on every Python."""
    fields = {name: descriptor.get(name) for name in ID_FIELDS}
    if descriptor.get("tvm_threads") is not None:  # hashed only when known: old ids stand
        fields["tvm_threads"] = descriptor["tvm_threads"]
    blob = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def from_manifest(hardware: dict[str, Any] | None, target: dict[str, Any] | None) -> dict[str, Any]:
    """The descriptor of a manifest's dataset-level ``hardware`` entry, measuring for ``target``.

    A descriptor this module wrote comes back as it is; an older entry (CPU model, cores,
    memory, OS) gets its target, ``isa`` and ``caches`` as unknown (``None``) and its own id.
    """
    hardware = dict(hardware or {})
    if "id" in hardware and "isa" in hardware:
        return hardware
    descriptor = {name: hardware.get(name) for name in ID_FIELDS}
    descriptor.update({k: v for k, v in hardware.items() if k not in descriptor})
    descriptor["target"] = descriptor["target"] or target
    descriptor["described"] = "before per-record machines: ISA flags and caches unknown"
    descriptor["id"] = machine_id(descriptor)
    return descriptor


def target_mismatch(measured: Any, expected: dict[str, Any]) -> str:
    """Why a record's (or a machine's) target is not ``expected`` ('' when it is): the
    attributes that change the code, kind, CPU, cores and GPU arch, where ``expected`` names
    them."""
    if not isinstance(measured, dict):
        return "its target is not a JSON object"
    for attr in ("kind", "mcpu", "num-cores", "arch"):
        if attr in expected and str(measured.get(attr)) != str(expected[attr]):
            return f"target {attr}={measured.get(attr)!r}, expected {expected[attr]!r}"
    return ""


def isa_signature(descriptor: dict[str, Any]) -> tuple[str, ...] | None:
    """The codegen-relevant ISA flags of a descriptor, or ``None`` when they are unknown."""
    isa = descriptor.get("isa")
    return None if isa is None else tuple(sorted(isa))


def short(descriptor: dict[str, Any]) -> str:
    """One line for people: CPU, cores, the widest vector extensions, caches."""
    caches = descriptor.get("caches") or {}
    isa = descriptor.get("isa")
    shown = "ISA unknown" if isa is None else " ".join(isa) or "no vector extensions"
    sizes = ", ".join(f"{k.removesuffix('_kb').upper()} {_kib(v)}" for k, v in caches.items() if v)
    mcpu = (descriptor.get("target") or {}).get("mcpu")
    return (
        f"{descriptor.get('cpu_model') or '?'} ({descriptor.get('vendor') or '?'}"
        f"{', mcpu ' + mcpu if mcpu else ''}), {descriptor.get('physical_cores') or '?'} "
        f"physical / {descriptor.get('logical_cores') or '?'} logical cores"
        f"{', TVM on ' + str(descriptor['tvm_threads']) if descriptor.get('tvm_threads') else ''}"
        f"; {shown}"
        f"{'; ' + sizes if sizes else ''}"
    )


# --------------------------------------------------------------------------- readers


def parse_cpuinfo(text: str) -> list[dict[str, str]]:
    """``/proc/cpuinfo`` → one dict per processor block (x86), or per block Arm prints."""
    blocks, current = [], {}
    for line in text.splitlines():
        if not line.strip():
            if current:
                blocks.append(current)
                current = {}
            continue
        key, sep, value = line.partition(":")
        if sep:
            current[key.strip()] = value.strip()
    if current:
        blocks.append(current)
    return blocks


def cache_sizes(cache_dir: Path) -> dict[str, int | None]:
    """L1 data, L2 and L3 sizes in KiB of one CPU (its ``cache/index*`` directories)."""
    sizes: dict[str, int | None] = {"l1d_kb": None, "l2_kb": None, "l3_kb": None}
    for index in sorted(cache_dir.glob("index*")) if cache_dir.is_dir() else []:
        level, kind = _read(index / "level").strip(), _read(index / "type").strip()
        size = _kib_of(_read(index / "size").strip())
        if size is None or kind == "Instruction":
            continue
        name = {"1": "l1d_kb", "2": "l2_kb", "3": "l3_kb"}.get(level)
        if name:
            sizes[name] = size
    return sizes


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _kib_of(text: str) -> int | None:
    """``32K`` / ``1024K`` / ``2M`` / ``32768`` (bytes are never written bare there) → KiB."""
    units = {"K": 1, "M": 1024, "G": 1024 * 1024}
    try:
        if text and text[-1].upper() in units:
            return int(text[:-1]) * units[text[-1].upper()]
        return int(text) // 1024 if text else None
    except ValueError:
        return None


def _kib(kb: int) -> str:
    return f"{kb // 1024} MiB" if kb >= 1024 and kb % 1024 == 0 else f"{kb} KiB"


def _model(entry: dict[str, str]) -> str | None:
    if entry.get("model name"):
        return entry["model name"]
    if entry.get("CPU part"):  # Arm: no model name, an implementer and a part number
        return f"Arm part {entry['CPU part']} rev {entry.get('CPU revision', '?')}"
    return platform.processor() or None


def _vendor(entry: dict[str, str]) -> str | None:
    if entry.get("vendor_id"):
        return entry["vendor_id"]
    implementer = entry.get("CPU implementer", "").lower()
    return ARM_IMPLEMENTERS.get(implementer, implementer or None)


def _core_counts(entries: list[dict[str, str]]) -> tuple[int | None, int | None]:
    """(logical, physical) from cpuinfo's blocks: x86 names each thread's socket and core;
    elsewhere psutil's count is the best there is."""
    import psutil

    logical = sum(1 for e in entries if "processor" in e) or psutil.cpu_count()
    cores = {(e["physical id"], e["core id"]) for e in entries if "core id" in e}
    if cores:
        return logical, len(cores)
    return logical, psutil.cpu_count(logical=False) or logical


def _max_mhz(path: Path) -> int | None:
    # cpuinfo_max_freq is the hardware's ceiling in kHz. The "cpu MHz" of /proc/cpuinfo is
    # the clock of the moment and would give one machine a new id every run.
    text = _read(path).strip()
    return int(text) // 1000 if text.isdigit() else None


def _memory_gb() -> float | None:
    import psutil

    try:
        return round(psutil.virtual_memory().total / 2**30, 1)
    except OSError:
        return None
