"""SHA-256 digests of a registered model's files, and the check that runs before any is loaded.

Loading a shared library runs its constructors, and MLflow's loader imports the model's Python
file, so whoever can write to the artifact store runs code on every machine that loads a model
from it. The registry therefore records the digest of every file of a model version in that
version's tags (``sha256/<path>``), and a pull compares the downloaded files against them
before handing the directory to MLflow. The tags live in the tracking store's database, not in
the artifact store the files come from: rewriting the artifacts cannot make them pass.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

TAG_PREFIX = "sha256/"
# Written by MLflow on the downloading side (the registered name and version), not stored.
LOCAL_ONLY = frozenset({"registered_model_meta"})


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def manifest(root: Path) -> dict[str, str]:
    """``{path relative to root (POSIX): SHA-256}`` of every file under ``root``."""
    return {
        p.relative_to(root).as_posix(): sha256_file(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.relative_to(root).as_posix() not in LOCAL_ONLY
    }


def manifest_tags(files: dict[str, str]) -> dict[str, str]:
    """A manifest as model version tags."""
    return {TAG_PREFIX + path: digest for path, digest in files.items()}


def tagged_manifest(tags: dict[str, str]) -> dict[str, str]:
    """The manifest recorded in a model version's tags (empty when it has none)."""
    return {k.removeprefix(TAG_PREFIX): v for k, v in tags.items() if k.startswith(TAG_PREFIX)}


def mismatches(expected: dict[str, str], actual: dict[str, str]) -> list[tuple[str, str]]:
    """``(path, what is wrong with it)`` for every file that differs; empty when ``actual`` is
    exactly ``expected``: a file added to the store is refused as surely as a changed one."""
    problems = []
    for path, digest in sorted(expected.items()):
        if path not in actual:
            problems.append((path, "is missing"))
        elif actual[path] != digest:
            found = f"registered {digest[:12]}…, found {actual[path][:12]}…"
            problems.append((path, f"does not match its registered SHA-256 ({found})"))
    extra = sorted(actual.keys() - expected.keys())
    return problems + [(path, "is not one of its registered files") for path in extra]
