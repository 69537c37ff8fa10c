"""Registry faults and the integrity of pulled code, with real processes.

One tune per module: its MLflow server (on 127.0.0.1) is stopped while it tunes, so its
registration fails; the run directory it leaves serves every test here.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from gradtune.errors import GradtuneError
from gradtune.measure.rpc_fleet import LocalFleet, check_fleet_host, free_port
from tests.conftest import EXAMPLES, ROOT, http_server, run_cli

NAME = "faults-mlp"


@contextlib.contextmanager
def mlflow_server(root: Path, port: int):
    """A real MLflow server whose store (sqlite + artifacts under ``root``) outlives it, so the
    same registry can be stopped and started again on the same port."""
    argv = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
            "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
            "--artifacts-destination", str(root / "artifacts"), "--workers", "1"]  # fmt: skip
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with http_server(argv, f"http://127.0.0.1:{port}/health", env):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def failed_registration(tmp_path_factory):
    """``gradtune tune`` whose MLflow server answers its pre-check, then stops mid-tune."""
    root = tmp_path_factory.mktemp("faults-registry")
    port, out = free_port(), root / "run"
    log_out, log_err = root / "tune.stdout", root / "tune.stderr"
    with mlflow_server(root / "store", port) as uri:
        argv = [sys.executable, "-m", "gradtune.cli", "tune", str(EXAMPLES / "small_cnn.py"),
                "--entry", "tiny_mlp", "--trials", "4", "--out", str(out), "--name", NAME,
                "--mlflow-uri", uri]  # fmt: skip
        with open(log_out, "w") as stdout, open(log_err, "w") as stderr:
            proc = subprocess.Popen(argv, cwd=ROOT, stdout=stdout, stderr=stderr, text=True)
        records = out / "database_tuning_record.json"
        deadline = time.monotonic() + 400
        # After the first measured record: the tune has looked up its cost model in this
        # registry by then, and compiling is still to come before registration.
        while proc.poll() is None and time.monotonic() < deadline:
            if records.exists() and records.stat().st_size > 0:
                break
            time.sleep(0.2)
        assert proc.poll() is None, f"the tune ended early:\n{log_err.read_text()[-3000:]}"
    start = time.monotonic()
    proc.wait(timeout=400)
    return SimpleNamespace(
        root=root, store=root / "store", port=port, uri=uri, out=out,
        returncode=proc.returncode, stdout=log_out.read_text(), stderr=log_err.read_text(),
        seconds_after_stop=time.monotonic() - start,
    )  # fmt: skip


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("gradtune: error:")]


@pytest.mark.slow
def test_mlflow_down_at_registration_is_retried_then_registered_later(
    failed_registration, tmp_path
):
    run = failed_registration
    output = run.stdout + run.stderr
    assert run.returncode == 3, output[-3000:]
    (line,) = _error_lines(run.stderr)
    assert f"could not register the model in MLflow at {run.uri}" in line
    assert f"kept in {run.out}" in line
    # Declared on the Prefect task: three retries after about 4, 8 and 16 s, then the line.
    delays = re.findall(r"Retry (\d)/3 will start ([\d.]+) second", output)
    assert [int(attempt) for attempt, _ in delays] == [1, 2, 3], output[-3000:]
    for attempt, delay in delays:
        assert 0.8 <= float(delay) / (4 * 2 ** (int(attempt) - 1)) <= 1.2, delays
    assert run.seconds_after_stop > sum(float(delay) for _, delay in delays)
    for name in ("model.so", "database_tuning_record.json", "database_workload.json"):
        assert (run.out / name).stat().st_size > 0, name
    assert not (run.out / "summary.json").exists()

    command = line.split("register them later with: ", 1)[1]
    assert command == f"gradtune register {run.out} --mlflow-uri {run.uri}"
    with mlflow_server(run.store, run.port):
        import mlflow

        client = mlflow.MlflowClient(run.uri)
        assert client.search_model_versions(f"name = '{NAME}'") == [], "a version was left"
        registered = run_cli(*shlex.split(command)[1:], timeout=300)
        assert registered.returncode == 0, registered.stdout + registered.stderr
        assert f"registered {NAME}@champion" in registered.stdout.replace("\n", " ")
        summary = json.loads((run.out / "summary.json").read_text())
        assert summary["registered"] == f"{NAME}@champion" and summary["mlflow_uri"] == run.uri
        (version,) = client.search_model_versions(f"name = '{NAME}'")
        assert version.version == summary["model_version"]

        pulled = run_cli("pull", f"{NAME}@champion", "--out", str(tmp_path / "pulled"),
                         "--mlflow-uri", run.uri, timeout=300)  # fmt: skip
        assert pulled.returncode == 0, pulled.stderr
        info = json.loads(pulled.stdout)
        assert info["verified"] and info["output_shapes"] == [[4, 16]] and info["finite"]


def _register_in_sqlite(run_dir: Path, store: Path) -> str:
    store.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{store / 'mlflow.db'}"
    registered = run_cli("register", str(run_dir), "--mlflow-uri", uri, timeout=300)
    assert registered.returncode == 0, registered.stdout + registered.stderr
    return uri


@pytest.mark.slow
def test_tampered_model_so_is_refused_before_its_code_runs(failed_registration, tmp_path):
    if shutil.which("cc") is None:
        pytest.skip("no C compiler: cannot build a library whose constructor leaves a marker")
    marker = tmp_path / "constructor-ran"
    source = tmp_path / "ctor.c"
    source.write_text(
        "#include <stdio.h>\n"
        "__attribute__((constructor)) static void ran(void) {\n"
        f'  FILE *f = fopen("{marker}", "w"); if (f) fclose(f);\n'
        "}\n"
    )
    library = tmp_path / "ctor.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    # The marker proves a load: loading the library once leaves it.
    subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(library)!r})"],
                   check=True)  # fmt: skip
    assert marker.exists()
    marker.unlink()

    uri = _register_in_sqlite(failed_registration.out, tmp_path / "store")
    (stored,) = (tmp_path / "store" / "mlartifacts").rglob("artifacts/model.so")
    shutil.copyfile(library, stored)

    for extra in ([], ["--allow-unverified"]):  # which only admits versions without checksums
        pulled = run_cli("pull", f"{NAME}@champion", "--out", str(tmp_path / "pulled"),
                         "--mlflow-uri", uri, *extra, timeout=300)  # fmt: skip
        assert pulled.returncode != 0
        assert "Traceback" not in pulled.stderr
        (line,) = _error_lines(pulled.stderr)
        assert line.startswith(
            f"gradtune: error: model.so of {NAME}@champion does not match its registered SHA-256"
        ), line
        assert not marker.exists(), "pull ran the tampered library's code"
    assert not (tmp_path / "pulled" / "artifacts" / "model.so").exists()

    # Plain MLflow: the pyfunc's load_context checks before it loads the library.
    code = (
        "import mlflow;"
        f"mlflow.set_tracking_uri({uri!r});"
        f"mlflow.pyfunc.load_model('models:/{NAME}@champion')"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300, cwd=tmp_path)  # fmt: skip
    assert loaded.returncode != 0
    assert "model.so does not match its registered SHA-256" in loaded.stderr, loaded.stderr
    assert not marker.exists(), "load_context ran the tampered library's code"


@pytest.mark.slow
def test_version_without_checksums_is_refused_unless_allowed(failed_registration, tmp_path):
    import mlflow

    uri = _register_in_sqlite(failed_registration.out, tmp_path / "store")
    client = mlflow.MlflowClient(uri)
    version = client.get_model_version_by_alias(NAME, "champion")
    for key in version.tags:  # as registered before checksums existed
        if key.startswith("sha256/"):
            client.delete_model_version_tag(NAME, version.version, key)

    args = ["pull", f"{NAME}@champion", "--out", str(tmp_path / "pulled"), "--mlflow-uri", uri]
    refused = run_cli(*args, timeout=300)
    assert refused.returncode != 0
    (line,) = _error_lines(refused.stderr)
    assert "registered without SHA-256 checksums" in line and "--allow-unverified" in line
    assert not (tmp_path / "pulled").exists()

    allowed = run_cli(*args, "--allow-unverified", timeout=300)
    assert allowed.returncode == 0, allowed.stderr
    info = json.loads(allowed.stdout)
    assert not info["verified"] and info["output_shapes"] == [[4, 16]]


def test_fleet_refuses_to_listen_beyond_loopback():
    fleet = LocalFleet(host="0.0.0.0")
    with pytest.raises(GradtuneError, match="refusing to start RPC servers on 0.0.0.0"):
        with fleet:
            pass
    assert fleet._procs == [], "no process was started"
    for host in ("127.0.0.1", "::1", "localhost"):
        check_fleet_host(host, allow_network=False)
    check_fleet_host("0.0.0.0", allow_network=True)
