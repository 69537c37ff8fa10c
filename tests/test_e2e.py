"""The whole pipeline through the CLI, as a user runs it (slow; runs in CI)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from gradtune import threads
from gradtune.measure.rpc_fleet import free_port
from tests.conftest import EXAMPLES, ROOT, http_server, run_cli

pytestmark = pytest.mark.slow


def _records(out: Path) -> list[str]:
    path = out / "database_tuning_record.json"
    return path.read_text().splitlines() if path.exists() else []


def _check_outputs(out: Path, trials: int) -> dict:
    summary = json.loads((out / "summary.json").read_text())
    for key in ("model", "target", "trials", "tuning_seconds", "untuned_ms", "tuned_ms",
                "reference_ms", "max_abs_err", "registered", "mlflow_uri"):  # fmt: skip
        assert key in summary, key
    assert summary["total_trials"] == len(_records(out)) == trials
    assert summary["lowering"] == {
        "weight_prepack": False,
        "fast_math": True,
        "conv_layout": "NCHW",
        "fold_batchnorm": False,
        "subpixel_conv_transpose": True,
    }
    if summary["search"] == "gradient":  # the defaults it searched with, every field
        from gradtune.search.gradient_search import GradientConfig

        assert summary["gradient_config"] == json.loads(json.dumps(GradientConfig()._asdict()))
    else:
        assert summary["gradient_config"] is None
    assert summary["untuned_ms"] > 0 and summary["tuned_ms"] > 0 and summary["reference_ms"] > 0
    assert summary["max_abs_err"] < 1e-2
    assert {"import", "partition", "tune", "compile"} <= set(summary["stage_seconds"])
    # The code that tuned it: this checkout's HEAD (the tests run from the repository).
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    assert summary["gradtune_commit"].removesuffix("-dirty") == head.stdout.strip()
    report = (out / "report.md").read_text()
    assert report.startswith("# gradtune report")
    # The peers, timed beside the tuned model: each has a latency or says why it has none.
    assert set(summary["peers"]) == {"ONNX Runtime", "torch.compile", "PyTorch eager"}
    for name, peer in summary["peers"].items():
        assert peer["ms"] > 0 if peer["error"] is None else peer["ms"] is None, (name, peer)
        assert f"| {name} |" in report
    ort = summary["peers"]["ONNX Runtime"]
    assert ort["ms"] > 0 and ort["ratio_vs_tuned"] == pytest.approx(summary["tuned_ms"] / ort["ms"])
    # Peers and the tuned model on the same count: the target's cores (TVM_NUM_THREADS), or
    # the count the environment names.
    expected = threads.target_threads(summary["target"])
    assert summary["peer_threads"] == summary["tvm_threads"] == expected
    timing = summary["timing"]  # the rounds the medians are of (gradtune.crosscore)
    assert timing["state"] in {"near", "apart", "moved"}
    assert 3 <= timing["kept_rounds"] <= timing["rounds"] == 7
    assert (timing["link_ns"] is None) == (expected < 2)
    assert f"the tuned model on {summary['tvm_threads']} (TVM's runtime" in report
    # The roofline: every task against the machine's peak, ONNX Runtime's profile per group.
    roof = summary["roofline"]
    assert roof["peak"]["gflops"] > 0 and roof["peak"]["gbps"] > 0
    assert [r["task"] for r in roof["tasks"]] == list(summary["best_task_us"])
    assert all(r["gflops"] > 0 and 0 < r["roofline_share"] for r in roof["tasks"])
    assert [g["group"] for g in roof["groups"]] == ["matmul"]  # two Linear layers
    assert roof["groups"][0]["ort_us"] > 0 and "Gemm" in " ".join(roof["groups"][0]["ort_ops"])
    assert "## Against what you would deploy instead" in report
    assert "## Where the time goes" in report and "Machine peak:" in report
    assert (out / "tuning_curve.png").stat().st_size > 1000
    assert (out / "model.so").exists()
    return summary


def test_pytorch_model_interrupted_then_resumed_then_pulled(tmp_path, capsys):
    from gradtune.cli import main  # the refusal without --resume needs no process of its own

    out = tmp_path / "mlp"
    model = str(EXAMPLES / "small_cnn.py")
    argv = [sys.executable, "-m", "gradtune.cli", "tune", model, "--entry", "tiny_mlp",
            "--trials", "8", "--out", str(out), "--name", "e2e-mlp"]  # fmt: skip
    # The leader of its own process group, as a terminal starts it: Ctrl-C reaches the group.
    proc = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 600
    while len(_records(out)) < 4 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert proc.poll() is None, "tuning finished before it could be interrupted"
    descendants = psutil.Process(proc.pid).children(recursive=True)
    start = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)  # while the RPC server measures
    output, _ = proc.communicate(timeout=60)
    took = time.monotonic() - start
    assert took < 10, f"stopped after {took:.1f} s"
    assert proc.returncode == 128 + signal.SIGINT, output[-3000:]
    message = (
        "gradtune: stopped by SIGINT; rerun the same command with --resume to continue "
        "(measured records are kept)"
    )
    assert output.strip().splitlines()[-1] == message, output[-3000:]
    assert output.count("gradtune: stopped") == 1 and "Traceback" not in output, output[-3000:]
    gone, alive = psutil.wait_procs(descendants, timeout=10)
    alive = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"left running: {[p.cmdline() for p in alive]}"

    before = _records(out)
    assert 4 <= len(before) < 8
    capsys.readouterr()
    assert main(argv[3:]) != 0  # refuses without --resume
    assert "--resume" in capsys.readouterr().err

    resumed = run_cli(*argv[3:], "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    after = _records(out)
    assert after[: len(before)] == before, "measurements from before the interruption were kept"
    # (workload, trace): every task's default schedule has the same empty trace.
    traces = [json.dumps([json.loads(line)[0], json.loads(line)[1][0]]) for line in after]
    assert len(set(traces)) == len(traces), "a kept measurement was measured again"
    summary = _check_outputs(out, 8)
    assert summary["resumed_trials"] == len(before)
    # A PyTorch model: exported to ONNX for ONNX Runtime; eager is its reference.
    assert summary["peers"]["PyTorch eager"]["ms"] == summary["reference_ms"]
    if shutil.which("g++"):  # torch.compile's inductor builds C++
        assert summary["peers"]["torch.compile"]["ms"] > 0
    assert "registered e2e-mlp@champion" in resumed.stdout.replace("\n", " ")

    pulled = run_cli("pull", "e2e-mlp@champion", "--out", str(tmp_path / "pulled"),
                     "--mlflow-uri", summary["mlflow_uri"])  # fmt: skip
    assert pulled.returncode == 0, pulled.stderr
    assert json.loads(pulled.stdout)["output_shapes"] == [[4, 16]]


@pytest.fixture
def prefect_server(tmp_path):
    """A real Prefect API server on 127.0.0.1 with its own PREFECT_HOME."""
    port = free_port()
    env = {
        "PREFECT_HOME": str(tmp_path / "prefect-home"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
    }
    argv = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
            "--port", str(port)]  # fmt: skip
    url = f"http://127.0.0.1:{port}/api"
    with http_server(argv, url + "/health", env):
        yield url


def test_onnx_model_end_to_end_on_prefect_server(tiny_onnx, tmp_path, prefect_server):
    """Also the gradient search's path through the whole product, MLflow logging included,
    the quiet confirmation of each task's best (``--confirm``), and an AWS secret in the
    environment that must appear nowhere."""
    out = tmp_path / "onnx"
    secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY"
    env = {"PREFECT_API_URL": prefect_server, "AWS_SECRET_ACCESS_KEY": secret}
    result = run_cli("tune", str(tiny_onnx), "--trials", "4", "--out", str(out),
                     "--search", "gradient", "--confirm", "2", env=env)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Starting temporary server" not in result.stderr  # the real server was used
    summary = _check_outputs(out, 4)  # the defaults and one batch of the search
    assert summary["framework"] == "onnx" and summary["reference"] == "ONNX Runtime"
    assert summary["peers"]["ONNX Runtime"]["ms"] == summary["reference_ms"]
    for name in ("torch.compile", "PyTorch eager"):  # PyTorch only through onnx2torch
        peer = summary["peers"][name]
        assert peer["ms"] or "onnx2torch" in peer["error"], peer
    assert summary["registered"] == "gradtune-tiny-mlp@champion"
    assert "ONNX Runtime" in result.stdout
    # Not a terminal: the progress bar draws only at its end, so plain lines show the rounds.
    assert re.search(r"^tuning: \d+/4 trials, \d+ s; kernels ≈ [\d.]+ ms$", result.stdout, re.M)
    # What compiled is what the confirmation chose, and the registry keeps its account.
    confirmed = json.loads((out / "confirmed.json").read_text())
    assert summary["confirmed_tasks"] == len(confirmed["tasks"]) > 0
    for task in confirmed["tasks"]:
        assert summary["best_task_us"][task["task"]] == task["quiet_us"][task["winner"]]

    body = json.dumps({"flows": {"name": {"any_": ["tune-model"]}}}).encode()
    request = urllib.request.Request(
        prefect_server + "/flow_runs/filter",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        runs = json.loads(resp.read())
    assert [r["state_type"] for r in runs] == ["COMPLETED"]

    import mlflow

    client = mlflow.MlflowClient(summary["mlflow_uri"])
    run = client.get_run(summary["run_id"])
    assert run.data.params["search"] == "gradient"
    assert "search_cost_model" in run.data.params
    assert json.loads(run.data.params["gradient_config"]) == summary["gradient_config"]
    history = client.get_metric_history(summary["run_id"], "search_seconds")
    assert history and all(m.value > 0 for m in history)
    measure = client.get_metric_history(summary["run_id"], "measure_seconds")
    assert len(measure) == len(history) and all(m.value > 0 for m in measure)
    assert run.data.params["search_cost_model"].endswith("weights/llvm.pt")  # pretrained
    artifacts = [a.path for a in client.list_artifacts(summary["run_id"], "report")]
    assert "report/search_rounds.json" in artifacts
    databases = [a.path for a in client.list_artifacts(summary["run_id"], "database")]
    assert "database/confirmed_tuning_record.json" in databases

    # Not in the output, the files written (summary.json, report.md, the MLflow store with its
    # params and tags, the artifacts), nor the run's params and tags.
    assert secret not in result.stdout + result.stderr
    for path in out.rglob("*"):
        assert not path.is_file() or secret.encode() not in path.read_bytes(), path
    assert not any(secret in v for v in [*run.data.params.values(), *run.data.tags.values()])
