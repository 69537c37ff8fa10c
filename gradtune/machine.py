"""Which CPU this is, and what gradtune keeps about it between runs (``~/.cache/gradtune``).

A virtual machine's CPU name can hide the hardware: a 2-vCPU KVM guest on a Zen 2 (family 23
model 49, AVX2 only) is named just "AMD EPYC", as guests on AVX-512 Zen 4 and Zen 5 hosts can
be. So a CPU is named by its model name and, where ``/proc/cpuinfo`` gives them, its family and
model numbers: a figure measured on one is never read back on another.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/gradtune``, else ``~/.cache/gradtune``."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "gradtune"


def cpu_name() -> str:
    """The CPU's model name, with its family and model numbers where the system gives them."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                break  # the first processor's block names them all
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']} model {fields['model']})"
    return name


def machine_key(threads: int) -> str:
    """The key of this CPU on ``threads`` threads in a cache file."""
    return f"{cpu_name()} | {threads} threads"


def read_cache(path: Path) -> dict[str, Any]:
    """A cache file's entries; none when it is missing or unreadable (then it is measured again)."""
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return cached if isinstance(cached, dict) else {}


def write_cache(path: Path, key: str, value: Any) -> None:
    """Set one entry of a cache file, keeping the others."""
    cached = read_cache(path)
    cached[key] = value
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.partial")
    partial.write_text(json.dumps(cached, indent=1))
    partial.replace(path)  # another process reading the cache never sees half a file
