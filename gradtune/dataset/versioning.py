"""Versioning a collected dataset with DVC: ``dvc add`` when a collection ends, ``dvc push``
when asked.

Measurements are raw data: no command reproduces them (they depend on the machine and the
moment), so DVC tracks the dataset directory with a ``.dvc`` file beside it (``data.dvc``)
rather than as a ``dvc.yaml`` stage output; ``featurize`` and ``pretrain`` are stages that
depend on it. DVC is driven through its command line (``python -m dvc``), the interface it
documents; its ``Repo`` class is internal and changes between releases.

A directory outside any DVC repository (a scratch collection under ``/tmp``) is collected
but not versioned. Asking to push one is bad input, refused before the collection starts.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

from ..errors import GradtuneError

log = logging.getLogger(__name__)


def dvc_root(path: str | Path) -> Path | None:
    """The DVC repository holding ``path`` (the nearest parent with a ``.dvc/`` directory)."""
    path = Path(path).resolve()
    for folder in (path, *path.parents):
        if (folder / ".dvc").is_dir():
            return folder
    return None


def _dvc(root: Path, *args: str) -> str:
    """Run ``dvc ARGS`` in ``root``; its output, or its last error line as a GradtuneError."""
    result = subprocess.run(
        [sys.executable, "-m", "dvc", *args],
        cwd=root,
        capture_output=True,
        text=True,
        env={**os.environ, "DVC_NO_ANALYTICS": "1"},
    )
    if result.returncode != 0:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        reason = lines[-1].removeprefix("ERROR: ") if lines else f"exit {result.returncode}"
        raise GradtuneError(f"dvc {args[0]} in {root}: {reason}")
    return result.stdout


def check_versioning(data_dir: str | Path, push: bool, remote: str | None) -> None:
    """Refuse, before anything is measured, a push DVC could not do at the end."""
    if remote is not None and not push:
        raise GradtuneError("--remote names where to push: pass it with --push")
    if not push:
        return
    root = dvc_root(data_dir)
    if root is None:
        raise GradtuneError(f"--push: {data_dir} is not inside a DVC repository")
    if remote is not None:
        names = [line.split()[0] for line in _dvc(root, "remote", "list").splitlines() if line]
        if remote not in names:
            raise GradtuneError(
                f"--remote {remote!r} is not a DVC remote of {root}; "
                f"choose one of {', '.join(names) or '(none configured)'}"
            )


def add_dataset(data_dir: str | Path) -> str | None:
    """``dvc add`` the dataset directory; returns its ``.dvc`` file, or None (and says so)
    when the directory lies in no DVC repository."""
    data_dir = Path(data_dir).resolve()
    root = dvc_root(data_dir)
    if root is None:
        log.info("%s is not inside a DVC repository: not versioned", data_dir)
        return None
    target = data_dir.relative_to(root)
    _dvc(root, "add", "--quiet", str(target))
    dvc_file = root / f"{target}.dvc"
    log.info("versioned %s as %s (commit it to git)", data_dir, dvc_file)
    return str(dvc_file)


def push_dataset(dvc_file: str | Path, remote: str | None = None) -> None:
    """``dvc push`` what ``dvc_file`` tracks, to ``remote`` (None: the repository's default)."""
    dvc_file = Path(dvc_file).resolve()
    root = dvc_root(dvc_file.parent)
    if root is None:
        raise GradtuneError(f"{dvc_file} is not inside a DVC repository")
    _dvc(root, "push", "--quiet", *(["--remote", remote] if remote else []), str(dvc_file))
    log.info("pushed %s to %s", dvc_file.name, remote or "the default DVC remote")
