"""Bad input, as a user meets it: ``gradtune`` in a fresh process answers with one line.

Each case of the table asserts what every bad input must give: exactly one line on stderr,
``gradtune: error: ...``, a non-zero exit, no traceback, under 5 s of wall time (nothing slow,
such as Prefect, the RPC fleet or TVM, may start before the input is checked), and no output
directory left behind.
"""

from __future__ import annotations

import ctypes
import socket
import threading
import time
from pathlib import Path

import pytest

from gradtune.errors import GradtuneError
from gradtune.measure.rpc_fleet import free_port
from gradtune.preflight import check_tracking_uri, check_writable
from gradtune.target import check_device
from tests.conftest import EXAMPLES, run_cli

MODEL = str(EXAMPLES / "small_cnn.py")

FORWARD_FAILS = (
    "import torch\ndef get_model():\n    return torch.nn.Linear(64, 16), (torch.randn(4, 32),)\n"
)


def _onnx_matmul(path: Path, batch: int | str = "batch") -> Path:
    """x[batch, 64] @ W[64, 16]: a model ONNX Runtime runs without TVM (``batch`` a name:
    a dynamic dimension)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.ones((64, 16), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 16])],
        initializer=[weight],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.save(model, str(path))
    return path


def _gpu_driver_present() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


class NotATracker:
    """A TCP server on 127.0.0.1 that answers every connection with an HTTP error."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")


@pytest.fixture(scope="module")
def not_a_tracker():
    server = NotATracker()
    yield server.port
    server.sock.close()


# (case, argv with {placeholders} filled in by the test, text the error line must hold)
CASES = [
    ("missing-model", ["tune", "{tmp}/missing.py"], "model file not found"),
    ("model-is-dir", ["tune", "{tmp}"], "model path is not a file"),
    ("model-suffix", ["tune", "{tmp}/model.txt"], "expected a .py or .onnx file"),
    ("trials-zero", ["tune", "{model}", "--trials", "0"], "--trials must be positive"),
    ("trials-negative", ["tune", "{model}", "--trials", "-5"], "--trials must be positive"),
    ("trials-not-int", ["tune", "{model}", "--trials", "many"], "invalid int value"),
    ("budget-nan", ["tune", "{model}", "--time-budget", "nan"], "finite seconds, got nan"),
    ("budget-inf", ["tune", "{model}", "--time-budget", "inf"], "finite seconds, got inf"),
    ("budget-zero", ["tune", "{model}", "--time-budget", "0"], "--time-budget must be positive"),
    ("budget-negative", ["tune", "{model}", "--time-budget", "-1"], "must be positive"),
    ("unknown-search", ["tune", "{model}", "--search", "annealing"], "unknown --search"),
    ("unknown-warmup", ["tune", "{model}", "--warmup", "random"], "argument --warmup: invalid"),
    ("bad-name", ["tune", "{model}", "--name", "my model"], "--name 'my model'"),
    ("reserved-alias", ["tune", "{model}", "--alias", "v3"], "reserved by MLflow"),
    ("no-rpc-servers", ["tune", "{model}", "--rpc-servers", "0"], "--rpc-servers must be"),
    ("zero-dim", ["tune", "{dyn_onnx}", "--input-shape", "x=0,64"], "positive integer"),
    ("shape-syntax", ["tune", "{dyn_onnx}", "--input-shape", "x=1,a"], "not NAME=D1,D2"),
    ("shape-for-py", ["tune", "{model}", "--input-shape", "x=1,64"], "ONNX models only"),
    ("shape-unknown-input", ["tune", "{dyn_onnx}", "--input-shape", "y=2,64"], "unknown input"),
    ("dynamic-shape", ["tune", "{dyn_onnx}"], "dynamic shape; give it with --input-shape x="),
    ("onnx-wont-run", ["tune", "{dyn_onnx}", "--input-shape", "x=2,32"], "ONNX Runtime cannot"),
    ("onnx-garbage", ["tune", "{tmp}/garbage.onnx"], "is not a valid ONNX model"),
    ("forward-fails", ["tune", "{tmp}/forward_fails.py"], "fails on its own example inputs"),
    ("tracker-syntax", ["tune", "{model}", "--tracker", "gpu-box"], "is not HOST:PORT"),
    ("tracker-port", ["tune", "{model}", "--tracker", "h:99999", "--key", "k"], "1-65535"),
    ("tracker-no-key", ["tune", "{model}", "--tracker", "127.0.0.1:9190"], "needs --key"),
    ("tracker-closed", ["tune", "{model}", "--tracker", "{closed}", "--key", "k"], "unreachable"),
    ("not-a-tracker", ["tune", "{model}", "--tracker", "{http}", "--key", "k"],
     "is not a TVM RPC tracker"),
    ("mlflow-ftp", ["tune", "{model}", "--mlflow-uri", "ftp:/bad uri"], "scheme 'ftp'"),
    ("mlflow-no-colon", ["tune", "{model}", "--mlflow-uri", "http//nohost"], "a local path"),
    ("mlflow-no-host", ["tune", "{model}", "--mlflow-uri", "http:/nohost"], "names no host"),
    ("mlflow-path", ["tune", "{model}", "--mlflow-uri", "{tmp}/mlruns"], "not in files"),
    ("mlflow-file", ["tune", "{model}", "--mlflow-uri", "file://{tmp}/mlruns"], "not in files"),
    ("mlflow-down", ["tune", "{model}", "--mlflow-uri", "http://127.0.0.1:{port}"],
     "cannot be reached"),
    ("mlflow-sqlite-dir", ["tune", "{model}", "--mlflow-uri", "sqlite:///{tmp}/no/m.db"],
     "directory does not exist"),
    ("mlflow-sqlite-memory", ["tune", "{model}", "--mlflow-uri", "sqlite://"], "in-memory"),
    ("out-in-proc", ["tune", "{model}", "--out", "/proc/gradtune-x"], "cannot be written"),
    ("out-is-file", ["tune", "{model}", "--out", "{tmp}/file.txt"], "is not a directory"),
    ("out-under-file", ["tune", "{model}", "--out", "{tmp}/file.txt/run"], "is not a directory"),
    ("target-json", ["tune", "{model}", "--target", "{not json"], "not valid JSON"),
    pytest.param(
        "cuda-no-gpu", ["tune", "{model}", "--target", "cuda"], "no usable GPU",
        marks=pytest.mark.skipif(_gpu_driver_present(), reason="this machine has a GPU driver"),
    ),
    ("no-subcommand", [], "required: command"),
    ("pull-no-store", ["pull", "m@champion", "--mlflow-uri", "sqlite:///{tmp}/m.db"],
     "store does not exist"),
    ("pull-out-in-proc", ["pull", "m@champion", "--out", "/proc/gradtune-x", "--mlflow-uri",
                          "sqlite:///{tmp}/m.db"], "cannot be written"),
]  # fmt: skip


@pytest.mark.parametrize(
    "case, argv, expected", CASES, ids=[getattr(c, "values", c)[0] for c in CASES]
)
def test_bad_input_gives_one_line(case, argv, expected, tmp_path, not_a_tracker):
    (tmp_path / "forward_fails.py").write_text(FORWARD_FAILS)
    (tmp_path / "garbage.onnx").write_bytes(b"\x00not an onnx protobuf" * 10)
    (tmp_path / "model.txt").write_text("not a model")
    (tmp_path / "file.txt").write_text("a file")
    dyn_onnx = _onnx_matmul(tmp_path / "dyn.onnx")
    before = sorted(tmp_path.iterdir())
    out = tmp_path / "out"
    values = {
        "tmp": str(tmp_path), "model": MODEL, "dyn_onnx": str(dyn_onnx),
        "port": str(free_port()), "closed": f"127.0.0.1:{free_port()}",
        "http": f"127.0.0.1:{not_a_tracker}",
    }  # fmt: skip
    for key, value in values.items():
        argv = [a.replace("{" + key + "}", value) for a in argv]
    if argv and "--out" not in argv:
        argv += ["--out", str(out)]

    start = time.monotonic()
    result = run_cli(*argv, timeout=60)
    seconds = time.monotonic() - start

    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gradtune: error: "), result.stderr
    assert expected in lines[0]
    assert result.returncode != 0
    assert "Traceback" not in result.stderr + result.stdout
    assert seconds < 5, f"{case}: {seconds:.1f} s"
    assert not out.exists() and not Path("/proc/gradtune-x").exists()
    assert sorted(tmp_path.iterdir()) == before, "bad input must leave nothing behind"


def test_debug_shows_the_traceback(tmp_path):
    (tmp_path / "forward_fails.py").write_text(FORWARD_FAILS)
    result = run_cli("--debug", "tune", str(tmp_path / "forward_fails.py"),
                     "--out", str(tmp_path / "out"), timeout=60)  # fmt: skip
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "RuntimeError" in result.stderr  # the cause too
    assert lines[-1].startswith("gradtune: error: ") and "fails on its own" in lines[-1]


def test_tracking_uri_checks(tmp_path):
    check_tracking_uri(f"sqlite:///{tmp_path / 'x.db'}")
    assert not (tmp_path / "x.db").exists(), "checking a store must not create it"
    with pytest.raises(GradtuneError, match="store does not exist"):
        check_tracking_uri(f"sqlite:///{tmp_path / 'x.db'}", existing=True)
    with pytest.raises(GradtuneError, match="directory does not exist"):
        check_tracking_uri(f"sqlite:///{tmp_path / 'missing' / 'x.db'}")
    with pytest.raises(GradtuneError, match="cannot be reached"):
        check_tracking_uri(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(GradtuneError, match="unsupported MLflow tracking URI"):
        check_tracking_uri("ftp://x")
    for uri in ("mlruns", "./mlruns", "/abs/mlruns", "file:///abs/mlruns", "C:\\mlruns"):
        with pytest.raises(GradtuneError, match="not in files"):
            check_tracking_uri(uri)
    for uri in ("databricks", "databricks://profile", "postgresql://u:p@db/mlflow"):
        check_tracking_uri(uri)  # accepted: MLflow keeps registries there (no server needed)


def test_check_writable_leaves_nothing(tmp_path):
    check_writable(tmp_path / "a" / "b", "--out")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(GradtuneError, match="cannot be written"):
        check_writable(Path("/proc/gradtune-x"), "--out")


def test_cuda_device_check():
    check_device({"kind": "llvm"})
    if _gpu_driver_present():
        pytest.skip("a GPU driver is present: whether TVM can use it depends on its build")
    with pytest.raises(GradtuneError, match="no usable GPU"):
        check_device({"kind": "cuda"})


def test_imported_model_is_reused_until_the_file_changes(tmp_path):
    from gradtune.frontend import load_model

    path = _onnx_matmul(tmp_path / "m.onnx", batch=2)
    first = load_model(path)
    assert load_model(path) is first
    _onnx_matmul(path, batch=3)
    assert load_model(path).inputs[0].shape == (3, 64)
