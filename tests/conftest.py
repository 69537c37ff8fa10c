"""Shared fixtures. Tests run real components: TVM, RPC tracker/servers, MLflow, Prefect."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
BENCH = ROOT / "bench"

os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
warnings.filterwarnings("ignore", category=FutureWarning)


def run_cli(
    *args: str, cwd: Path | None = None, timeout: float = 900, env: dict | None = None
) -> subprocess.CompletedProcess:
    """``gradtune ...`` in a fresh process, as a user runs it (``env`` adds variables)."""
    return subprocess.run(
        [sys.executable, "-m", "gradtune.cli", *args],
        cwd=cwd or ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@contextlib.contextmanager
def http_server(argv: list[str], health_url: str, env: dict | None = None):
    """Start a real server process on 127.0.0.1, wait until ``health_url`` answers, stop it."""
    proc = subprocess.Popen(
        argv, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(health_url, timeout=2):
                    break
            except OSError:
                assert proc.poll() is None, f"{argv[2]} server exited with {proc.returncode}"
                if time.monotonic() > deadline:
                    pytest.fail(f"{health_url} did not answer within 120 s")
                time.sleep(0.5)
        yield
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def fleet():
    """One local RPC fleet for a module's tunes (starting one takes ~5 s on 2 cores); not for
    tests that stop, kill or interrupt it."""
    from gradtune.measure.rpc_fleet import LocalFleet

    with LocalFleet() as tracker:
        yield tracker


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real MLflow tracking server (sqlite store, proxied artifacts) on 127.0.0.1."""
    from gradtune.measure.rpc_fleet import free_port

    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    argv = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
            "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
            "--artifacts-destination", str(root / "artifacts"), "--workers", "1"]  # fmt: skip
    uri = f"http://127.0.0.1:{port}"
    # Job execution off halves the server's memory (to ~0.5 GB).
    with http_server(argv, uri + "/health", {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}):
        yield uri


@pytest.fixture(scope="session")
def llvm_target():
    from gradtune.target import make_target, parse_target

    return make_target(parse_target(None))


def search_on(task, target, config):
    """(gradient search of ``config`` on ``task`` with its own session, the session, the
    MetaSchedule context), as the task scheduler sets a clone up."""
    from tvm.s_tir import meta_schedule as ms

    from gradtune.search import make_strategy
    from gradtune.search.session import Session

    search = make_strategy("gradient", config=config)
    session = Session()
    search.attach(session)
    context = ms.TuneContext(
        mod=task.mod, target=target, space_generator="post-order-apply",
        search_strategy="replay-trace", task_name=task.name, num_threads=2,
    ).clone()  # fmt: skip
    search._initialize_with_tune_context(context)
    return search, session, context


@pytest.fixture(scope="session")
def small_cnn_conv(llvm_target):
    """The example CNN's largest convolution: a task with several modelled sketches."""
    from gradtune.frontend import load_model
    from gradtune.partition import partition
    from gradtune.tvm_compat import register_tensor_intrinsics

    register_tensor_intrinsics("llvm")
    model = load_model(EXAMPLES / "small_cnn.py")
    _, tasks = partition(model.mod, model.params, llvm_target)
    return max(tasks, key=lambda t: t.flops)


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


@pytest.fixture(autouse=True)
def _tracking_uri_stays_in_its_test():
    """``mlflow.set_tracking_uri`` also exports ``MLFLOW_TRACKING_URI`` (for child
    processes): a test that reads a registry in-process would otherwise hand its server, long
    stopped, to every later test that defaults to the environment's registry."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    if before is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = before


@pytest.fixture(scope="module")
def bench_on_path():
    """bench/'s packages (searchbench, transferbench) importable: they are not installed."""
    sys.path.insert(0, str(BENCH))
    yield
    sys.path.remove(str(BENCH))


def assert_bench_refuses(script: str, tmp_path: Path, args: list[str], says: str) -> None:
    """``bench/<script> --work … --out … args`` exits non-zero with one line on stderr that
    contains ``says``, prints nothing else, and writes nothing."""
    done = subprocess.run(
        [sys.executable, str(BENCH / script), "--work", str(tmp_path / "work"),
         "--out", str(tmp_path / "out"), *args],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr
    assert done.stdout == ""
    assert not (tmp_path / "work").exists() and not (tmp_path / "out").exists()
