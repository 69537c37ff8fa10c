"""Where a registered version came from, as MLflow model-version tags.

MLflow versions are immutable and aliases move between them, so a version must say by itself
what it was tuned from: the fingerprint retune compares against (``gradtune.retune``), the
git commit of the code and models, the version it challenged (``parent_version``), and its
latencies. The promotion decision adds its own tags (``gradtune.promotion``).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from .entrypoints import ROOT

FINGERPRINT = "fingerprint"
GIT_COMMIT = "git_commit"  # of the repository holding the model file
GRADTUNE_COMMIT = "gradtune_commit"  # of gradtune's checkout (often the same repository)
PARENT_VERSION = "parent_version"


def git_commit(repo: Path = ROOT) -> str:
    """HEAD of the checkout, ``-dirty`` when tracked files differ from it; "unknown" without
    git (an sdist, a container without ``.git``)."""
    try:
        head = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("-dirty" if dirty else "") if head else "unknown"


def version_tags(
    fingerprint: str, parts: dict[str, str], parent_version: str | None, model_path: str
) -> dict[str, str]:
    """The tags a retuned version is created with (latencies follow from the promotion)."""
    return {
        FINGERPRINT: fingerprint,
        GIT_COMMIT: git_commit(Path(model_path).resolve().parent),
        GRADTUNE_COMMIT: git_commit(),
        PARENT_VERSION: parent_version or "none",
        "model_path": model_path,
        "tvm_version": parts["tvm"],
        "gradtune_version": parts["gradtune"],
    }
