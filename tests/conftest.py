"""Shared fixtures. Tests run real components: TVM, RPC tracker/servers, MLflow, Prefect."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
warnings.filterwarnings("ignore", category=FutureWarning)


def run_cli(
    *args: str, cwd: Path | None = None, timeout: float = 900
) -> subprocess.CompletedProcess:
    """``gradtune ...`` in a fresh process, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "gradtune.cli", *args],
        cwd=cwd or ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="session")
def llvm_target():
    from gradtune.target import make_target, parse_target

    return make_target(parse_target(None))


@pytest.fixture(scope="session")
def tiny_model():
    from gradtune.frontend import load_model

    return load_model(EXAMPLES / "small_cnn.py", entry="tiny_mlp")


@pytest.fixture(scope="session")
def tiny_onnx(tmp_path_factory) -> Path:
    """The tiny MLP exported to ONNX (TorchScript exporter: no onnxscript needed)."""
    import torch

    sys.path.insert(0, str(EXAMPLES))
    try:
        from small_cnn import tiny_mlp
    finally:
        sys.path.pop(0)
    model, (x,) = tiny_mlp()
    path = tmp_path_factory.mktemp("onnx") / "tiny_mlp.onnx"
    torch.onnx.export(model, (x,), str(path), input_names=["x"], output_names=["y"], dynamo=False)
    return path
