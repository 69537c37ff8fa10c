"""prefect.yaml's deployments: what they declare, that their flows load and take typed
parameters, and (slow) the operator's four commands with real processes on 127.0.0.1:
``prefect server start``, ``work-pool create``, ``deploy --all``, ``worker start``, then
``prefect deployment run``."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
import yaml

from gradtune import flow_logging
from gradtune.errors import GradtuneError
from gradtune.job import fresh_out_dir
from tests.conftest import ROOT

PREFECT_YAML = ROOT / "prefect.yaml"
FLOWS = {
    "tune-model": "tune-model",
    "collect-dataset": "collect-dataset",
    "pretrain-cost-model": "pretrain-cost-model",
    "retune-on-change": "retune-on-change",
}


def _deployments() -> dict[str, dict]:
    return {d["name"]: d for d in yaml.safe_load(PREFECT_YAML.read_text())["deployments"]}


def _load_flow(entrypoint: str):
    from prefect.flows import load_flow_from_entrypoint

    cwd = os.getcwd()
    os.chdir(ROOT)  # entrypoints are relative to the checkout, as for `prefect deploy`
    try:
        return load_flow_from_entrypoint(entrypoint)
    finally:
        os.chdir(cwd)


# --------------------------------------------------------------------------- prefect.yaml


def test_prefect_yaml_declares_the_deployments_on_one_process_pool():
    from prefect.client.schemas.schedules import CronSchedule

    deployments = _deployments()
    assert set(FLOWS) <= set(deployments)
    assert {d["work_pool"]["name"] for d in deployments.values()} == {"gradtune"}
    assert deployments["tune-model"]["entrypoint"] == "flows/tune_model.py:tune_model"
    (weekly,) = deployments["collect-dataset"]["schedules"]
    cron = CronSchedule(cron=weekly["cron"], timezone=weekly["timezone"])
    assert cron.cron.split()[2:] == ["*", "*", "6"]  # Saturdays, once a week
    (nightly,) = deployments["retune-on-change"]["schedules"]
    assert CronSchedule(cron=nightly["cron"], timezone=nightly["timezone"])


def test_pretraining_is_triggered_by_a_completed_collection():
    from prefect.events import DeploymentTriggerTypes
    from pydantic import TypeAdapter

    (spec,) = _deployments()["pretrain-cost-model"]["triggers"]
    trigger = TypeAdapter(DeploymentTriggerTypes).validate_python(spec)
    assert trigger.expect == {"prefect.flow-run.Completed"}
    assert trigger.match_related.get("prefect.resource.name") == ["collect-dataset"]


@pytest.mark.parametrize("name", sorted(FLOWS))
def test_entrypoint_loads_its_flow_and_accepts_the_deployment_parameters(name):
    deployment = _deployments()[name]
    flow = _load_flow(deployment["entrypoint"])
    assert flow.name == FLOWS[name]
    flow.validate_parameters(deployment["parameters"])  # raises on a misspelt or mistyped one


def _typed(node: dict, definitions: dict) -> bool:
    """A JSON schema the UI can render as a form field: a type all the way down."""
    if "$ref" in node:
        return _typed(definitions[node["$ref"].rsplit("/", 1)[1]], definitions)
    for key in ("anyOf", "allOf"):
        if key in node:
            return all(_typed(n, definitions) for n in node[key])
    kind = node.get("type")
    if kind == "object":
        props = node.get("properties")
        extra = node.get("additionalProperties")
        return (
            bool(props)
            and all(_typed(p, definitions) for p in props.values())
            or (isinstance(extra, dict) and _typed(extra, definitions))
        )
    if kind == "array":
        return isinstance(node.get("items"), dict) and _typed(node["items"], definitions)
    return kind in ("string", "integer", "number", "boolean", "null")


@pytest.mark.parametrize("name", sorted(FLOWS))
def test_flow_parameters_are_typed_for_the_ui(name):
    from prefect.utilities.callables import parameter_schema

    schema = parameter_schema(_load_flow(_deployments()[name]["entrypoint"])).model_dump()
    untyped = [
        p for p, node in schema["properties"].items() if not _typed(node, schema["definitions"])
    ]
    assert not untyped, f"{name}: parameters the UI cannot render as fields: {untyped}"


def test_repeated_runs_get_fresh_output_directories(tmp_path):
    first = Path(fresh_out_dir("examples/small_cnn.py", root=tmp_path))
    assert first.parent == tmp_path and re.fullmatch(r"small_cnn-\d{8}T\d{6}Z", first.name)
    first.mkdir()
    assert fresh_out_dir("examples/small_cnn.py", root=tmp_path) != str(first)


def test_user_errors_reach_the_run_log_as_one_line():
    flow_logging.one_line_user_errors()
    flow_logging.one_line_user_errors()  # once per process, however often it is called
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(handler.format(record))
    logger = logging.getLogger("prefect.flow_runs")
    logger.addHandler(handler)
    try:
        user_error = GradtuneError("model file not found: nope.py")
        # As Prefect's engines log a failure, the same error twice (kept away from its API).
        for exc in (user_error, user_error, ValueError("a bug")):
            try:
                raise exc
            except Exception:
                logger.exception(
                    "Encountered exception during execution: %r", exc, extra={"send_to_api": False}
                )
    finally:
        logger.removeHandler(handler)
    assert records[0] == "GradtuneError: model file not found: nope.py"
    assert len(records) == 2 and "Traceback" in records[1]  # anything else keeps its traceback


# --------------------------------------------------------------------------- real processes


def _http(url: str, body: dict | None = None) -> object:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _wait_for(what: str, check, timeout: float, procs: list[subprocess.Popen]):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if (value := check()) is not None:
                return value
        for proc in procs:
            assert proc.poll() is None, f"{proc.args[:4]} exited ({proc.returncode}) before {what}"
        time.sleep(1)
    pytest.fail(f"no {what} within {timeout:.0f} s")


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each started process's group, then SIGKILL whatever of them and their
    descendants (flow-run processes start sessions of their own) is left."""
    family = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            family += [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(True)]
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    _, alive = psutil.wait_procs(family, timeout=15)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    for proc in procs:
        proc.wait(timeout=15)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_operator_commands_deploy_and_a_worker_runs_tune_model(tmp_path):
    """`prefect server start` → `work-pool create` → `deploy --all` → `worker start`, then two
    `prefect deployment run`s: a missing model file fails its run with one line, and the worker
    goes on to run a tuning of the tiny MLP to Completed, registered in MLflow."""
    from gradtune.measure.rpc_fleet import free_port

    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {
        **os.environ,
        "PREFECT_HOME": str(tmp_path / "prefect"),
        "PREFECT_API_URL": api,
        "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{tmp_path / 'prefect.db'}",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
        "PREFECT_WORKER_QUERY_SECONDS": "2",
    }
    prefect = str(Path(sys.executable).parent / "prefect")
    log = tmp_path / "logs"
    log.mkdir()

    def start(name: str, *args: str) -> subprocess.Popen:
        out = (log / f"{name}.log").open("w")
        return subprocess.Popen(
            [prefect, *args], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    def run(*args: str) -> str:
        result = subprocess.run(
            [prefect, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 0, f"prefect {' '.join(args)}:\n{result.stdout}{result.stderr}"
        return result.stdout

    procs: list[subprocess.Popen] = []
    try:
        procs.append(start("server", "server", "start", "--host", "127.0.0.1", "--port", str(port)))
        _wait_for("healthy server", lambda: _http(f"{api}/health") or None, 120, procs)
        run("work-pool", "create", "gradtune", "--type", "process")
        run("--no-prompt", "deploy", "--all")
        procs.append(start("worker", "worker", "start", "--pool", "gradtune", "--limit", "1"))

        def deployment_run(params: dict) -> str:
            out = run("deployment", "run", "tune-model/tune-model", "--params", json.dumps(params))
            return re.search(r"UUID: ([0-9a-f-]{36})", out).group(1)

        def ended(flow_run_id: str) -> dict | None:
            state = _http(f"{api}/flow_runs/{flow_run_id}")["state"]
            final = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")
            return state if state["type"] in final else None

        def run_logs(flow_run_id: str) -> list[str]:
            body = {"logs": {"flow_run_id": {"any_": [flow_run_id]}}, "limit": 200}
            return [entry["message"] for entry in _http(f"{api}/logs/filter", body)]

        def all_logs(flow_run_id: str) -> list[str]:
            """A run's logs reach the API in batches, and may do so after its state reads final.
            The engine's "Finished in state" comes last, so once it is there, so is the rest."""

            def complete() -> list[str] | None:
                messages = run_logs(flow_run_id)
                return (
                    messages if any(m.startswith("Finished in state") for m in messages) else None
                )

            return _wait_for("the run's last log line", complete, 60, procs)

        missing = deployment_run({"model": "examples/no_such_model.py"})
        state = _wait_for("end of the missing-model run", lambda: ended(missing), 180, procs)
        assert state["type"] == "FAILED"
        assert state["message"].count("\n") == 0
        assert "model file not found: examples/no_such_model.py" in state["message"]
        # The error once, as one line (then Prefect's "Finished in state Failed(...)" line).
        messages = [m for m in all_logs(missing) if not m.startswith("Finished in state")]
        errors = [m for m in messages if "GradtuneError" in m or "Traceback" in m]
        assert errors == ["GradtuneError: model file not found: examples/no_such_model.py"]

        out = tmp_path / "run"
        tuned = deployment_run(
            {
                "model": "examples/small_cnn.py",
                "entry": "tiny_mlp",
                "trials": 2,
                "out": str(out),
                "name": "deployed-mlp",
            }  # fmt: skip
        )
        state = _wait_for("end of the tuning run", lambda: ended(tuned), 600, procs)
        assert state["type"] == "COMPLETED", f"{state}\n" + (log / "worker.log").read_text()[-4000:]
        assert procs[1].poll() is None  # the worker kept serving through both runs
        messages = all_logs(tuned)
        assert any(m.startswith("partitioned into") for m in messages), messages  # gradtune's log

        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
        version = client.get_model_version_by_alias("deployed-mlp", "champion")
        assert version.status == "READY"
    finally:
        _stop(procs)
