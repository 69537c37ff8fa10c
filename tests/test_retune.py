"""Retune on change: fingerprints, the promotion rule, bad input, and (slow) the CI workflow's
own command lines against mlflow/server.sh (MLflow with S3 artifacts on moto)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, run_cli

from gradtune import compilation, promotion, retune
from gradtune.errors import GradtuneError
from gradtune.frontend import load_model
from gradtune.target import parse_target

MODEL = ROOT / "models" / "mlp_block.py"
WORKFLOW = ROOT / ".github" / "workflows" / "retune.yml"


def model_variant(tmp_path: Path, name: str, *edits: tuple[str, str]) -> Path:
    """A copy of models/mlp_block.py with text replacements."""
    text = MODEL.read_text()
    for old, new in edits:
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / name
    path.write_text(text)
    return path


def parts_of(path: Path, target: dict | None = None) -> dict[str, str]:
    return retune.fingerprint_parts(load_model(path), target or parse_target(None))


# --------------------------------------------------------------------------- fingerprint


def test_fingerprint_follows_graph_and_weights_not_source_text(tmp_path):
    base = parts_of(MODEL)
    assert base == parts_of(MODEL)  # stable
    commented = model_variant(
        tmp_path, "commented.py", ("class MLPBlock", "# a comment changes nothing\nclass MLPBlock")
    )
    assert parts_of(commented) == base
    reseeded = parts_of(
        model_variant(tmp_path, "reseeded.py", ("manual_seed(0)", "manual_seed(7)"))
    )
    assert reseeded["weights"] != base["weights"] and reseeded["graph"] == base["graph"]
    relu = parts_of(model_variant(tmp_path, "relu.py", ("torch.nn.functional.gelu", "torch.relu")))
    assert relu["graph"] != base["graph"] and relu["weights"] == base["weights"]
    assert len({retune.fingerprint(p) for p in (base, reseeded, relu)}) == 3


def test_fingerprint_covers_target_and_versions():
    model = load_model(MODEL)
    here = retune.fingerprint_parts(model, parse_target(None))
    other = retune.fingerprint_parts(model, parse_target('{"kind": "llvm", "num-cores": 1}'))
    assert retune.fingerprint(here) != retune.fingerprint(other)
    assert here["tvm"] and here["gradtune"].startswith("0.1.0+src.")
    assert retune.fingerprint({**here, "tvm": "0.28.0"}) != retune.fingerprint(here)


def test_source_digest_changes_with_code_not_bytecode(tmp_path):
    pkg = tmp_path / "pkg"
    shutil.copytree(ROOT / "gradtune" / "search", pkg, ignore=shutil.ignore_patterns("*.pyc"))
    before = retune.source_digest(pkg)
    (pkg / "__pycache__").mkdir(exist_ok=True)
    (pkg / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    assert retune.source_digest(pkg) == before
    first = sorted(pkg.glob("*.py"))[0]
    first.write_text(first.read_text() + "\n# changed\n")
    assert retune.source_digest(pkg) != before


# --------------------------------------------------------------------------- promotion rule


def test_decide_tolerates_noise_not_slowdowns():
    champion = [1.00, 1.01, 0.99, 1.02, 1.00, 0.98, 1.01]
    assert promotion.decide([x * 1.04 for x in champion], champion).promoted  # within 5%
    slower = promotion.decide([x * 1.10 for x in champion], champion)
    assert slower.outcome == "kept_champion" and "slower" in slower.reason
    # A drift both see cancels round by round: 8% slower in every round is 8% slower.
    noisy = [1.0, 1.3, 0.8, 1.2, 0.9, 1.25, 0.85]
    assert not promotion.decide([x * 1.08 for x in noisy], noisy).promoted
    # Noise each sees alone widens the tolerance beyond 5% (half the ratios' IQR).
    decision = promotion.decide([x * 1.08 for x in reversed(noisy)], noisy)
    assert decision.tolerance > 0.05 and decision.promoted
    assert decision.ratio == pytest.approx(1.08)
    tags = decision.tags()
    assert tags["promotion"] == "promoted" and float(tags["interleaved_champion_ms"]) > 0
    with pytest.raises(ValueError, match="same number"):
        promotion.decide([1.0, 1.0], [1.0, 1.0, 1.0])


def test_decide_on_real_interleaved_timings(bench_on_path):
    """Real work timed as the promotion times it (TVM modules on TVM's thread pool): the same
    work passes, four times the work does not.

    NumPy's BLAS is no stand-in: the block it runs first after the cross-core probe is
    often twice as slow, which made identical work look 5% slower (a failed CI run)."""
    from timing_position import tvm_matmul as work  # ``calls`` runs of one TVM module

    def timed(challenger_calls: int) -> dict[str, list[float]]:
        fns = {"challenger": work(calls=challenger_calls), "champion": work(calls=2)}
        return compilation.time_rounds(fns, promotion.REPEATS).kept()

    same = timed(2)
    assert promotion.decide(same["challenger"], same["champion"]).promoted
    slow = timed(8)
    assert promotion.decide(slow["challenger"], slow["champion"]).outcome == "kept_champion"


def test_aliased_reads_a_registry(tmp_path):
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert promotion.aliased("nothing-here", "champion", uri) is None
    client = mlflow.MlflowClient(uri)
    client.create_registered_model("m")
    assert promotion.aliased("m", "champion", uri) is None  # a model without the alias
    version = client.create_model_version("m", str(tmp_path), tags={"fingerprint": "abc"})
    client.set_registered_model_alias("m", "champion", version.version)
    found = promotion.aliased("m", "champion", uri)
    assert found.version == version.version and found.tags["fingerprint"] == "abc"


# --------------------------------------------------------------------------- config


def test_config_resolves_paths_and_selects(tmp_path):
    specs = retune.load_config(ROOT / "configs" / "models.yaml")
    assert [Path(s.path) for s in specs] == [MODEL]
    assert retune.registered_name(specs[0]) == "gradtune-mlp-block"
    assert retune.select(specs, ["mlp_block"]) == specs
    assert retune.select(specs, ["gradtune-mlp-block"]) == specs
    assert retune.select(specs, [str(MODEL)]) == specs
    other = retune.select(specs, ["elsewhere/net.py"])
    assert other[0].path == "elsewhere/net.py" and other[0].entry == "get_model"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("models: []\n", "lists no models"),
        ("models:\n  - {entry: x}\n", "has no 'path'"),
        ("models:\n  - {path: a.py, trials: 3}\n", "unknown key(s) trials"),
        ("models: [\n", "not valid YAML"),
    ],
)
def test_bad_config_is_one_line(tmp_path, text, message):
    config = tmp_path / "models.yaml"
    config.write_text(text)
    with pytest.raises(GradtuneError, match=message.replace("(", r"\(").replace(")", r"\)")):
        retune.load_config(config)


def _one_line_error(result: subprocess.CompletedProcess, code: int, fragment: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == code, result.stderr
    assert len(lines) == 1 and lines[0].startswith("gradtune: error:"), result.stderr
    assert fragment in lines[0], lines[0]


def test_cli_bad_input(tmp_path):
    out = tmp_path / "runs"
    env = {"MLFLOW_TRACKING_URI": ""}
    no_registry = run_cli("retune", "--out", str(out), cwd=ROOT, env=env)
    _one_line_error(no_registry, 2, "pass --mlflow-uri or set MLFLOW_TRACKING_URI")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    missing = run_cli("retune", "--config", str(tmp_path / "none.yaml"), "--mlflow-uri", uri)
    _one_line_error(missing, 2, "retune config not found")
    bad_trials = run_cli("retune", "--trials", "0", "--mlflow-uri", uri, "--out", str(out))
    _one_line_error(bad_trials, 2, "--trials must be positive")
    no_model = run_cli("retune", str(tmp_path / "gone.py"), "--mlflow-uri", uri)
    _one_line_error(no_model, 2, "model file not found")
    broken = tmp_path / "broken.py"
    broken.write_text("def get_model():\n    raise ValueError('boom')\n")
    raising = run_cli("retune", str(broken), "--mlflow-uri", uri, "--out", str(out))
    _one_line_error(raising, 2, "raised ValueError: boom")
    assert not out.exists() and not (tmp_path / "mlflow.db").exists()


def test_unreachable_registry_is_one_line_and_registers_nothing(tmp_path):
    from gradtune.measure.rpc_fleet import free_port

    out = tmp_path / "runs"
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    result = run_cli("retune", "--mlflow-uri", uri, "--trials", "4", "--out", str(out))
    _one_line_error(result, 2, "cannot be reached")
    assert not out.exists()  # nothing tuned, so nothing to register later either


def test_workflow_triggers_on_model_changes_and_reads_the_registry_from_secrets():
    workflow = yaml.safe_load(WORKFLOW.read_text())
    on = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as true
    assert set(on["push"]["paths"]) == {"models/**", "configs/models.yaml"}
    env = workflow["jobs"]["retune"]["env"]
    assert env["MLFLOW_TRACKING_URI"] == "${{ secrets.MLFLOW_TRACKING_URI }}"
    assert any("gradtune retune" in c for c in workflow_commands())


# --------------------------------------------------------------------------- slow: CI + S3


@contextlib.contextmanager
def tracking_server(home: Path):
    """mlflow/server.sh on free ports: MLflow (sqlite) with artifacts in moto's S3."""
    from gradtune.measure.rpc_fleet import free_port

    mlflow_port, s3_port = free_port(), free_port()
    env = {
        **os.environ, "PYTHON": sys.executable, "MLFLOW_HOME": str(home),
        "MLFLOW_PORT": str(mlflow_port), "S3_PORT": str(s3_port),
    }  # fmt: skip
    proc = subprocess.Popen(
        [str(ROOT / "mlflow" / "server.sh")], env=env, stdout=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        line = proc.stdout.readline()  # "ready: ..." once /health answers, or EOF
        assert line.startswith("ready: "), f"server.sh failed: {line!r}"
        yield f"http://127.0.0.1:{mlflow_port}", f"http://127.0.0.1:{s3_port}"
    finally:
        proc.send_signal(signal.SIGTERM)  # the script stops both servers and their workers
        proc.wait(timeout=60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # nothing left answering on its ports
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{mlflow_port}/health", timeout=1)
        except OSError:
            break
        time.sleep(0.5)
    else:
        pytest.fail("the MLflow server outlived mlflow/server.sh")


def workflow_commands() -> list[str]:
    """The retune workflow's command lines that run gradtune, as CI runs them."""
    steps = yaml.safe_load(WORKFLOW.read_text())["jobs"]["retune"]["steps"]
    commands = [s["run"] for s in steps if "gradtune" in s.get("run", "")]
    assert commands, "the workflow runs no gradtune command"
    return commands


def run_workflow(checkout: Path, uri: str, trials: int = 5) -> subprocess.CompletedProcess:
    """Each gradtune command line of the workflow, in ``checkout``, with the environment the
    workflow gives it (the secret URI, the trials variable)."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "RETUNE_TRIALS": str(trials)}
    for command in workflow_commands():
        result = subprocess.run(
            ["bash", "-eo", "pipefail", "-c", command], cwd=checkout, env=env,
            capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        if result.returncode:
            return result
    return result


def outcome(result: subprocess.CompletedProcess, name: str) -> dict:
    results = json.loads(result.stdout.strip().splitlines()[-1])
    return next(r for r in results if r["name"] == name)


@pytest.fixture(scope="module")
def ci(tmp_path_factory):
    """A checkout as CI has it (models/, configs/, .venv) and the tracking server."""
    checkout = tmp_path_factory.mktemp("checkout")
    (checkout / "models").mkdir()
    (checkout / "configs").mkdir()
    shutil.copy(MODEL, checkout / "models")
    shutil.copy(ROOT / "configs" / "models.yaml", checkout / "configs")
    (checkout / ".venv").symlink_to(ROOT / ".venv")
    home = tmp_path_factory.mktemp("mlflow-home")
    with tracking_server(home) as (uri, s3):
        yield {"checkout": checkout, "uri": uri, "s3": s3, "home": home}


def versions(uri: str, name: str) -> dict[str, dict]:
    import mlflow

    client = mlflow.MlflowClient(uri)
    return {v.version: v.tags for v in client.search_model_versions(f"name = '{name}'")}


def alias(uri: str, name: str, which: str) -> str:
    import mlflow

    return str(mlflow.MlflowClient(uri).get_model_version_by_alias(name, which).version)


@pytest.mark.slow
def test_workflow_retunes_then_skips_with_artifacts_in_s3(ci):
    """First push: the model is tuned, registered as challenger, verified and promoted; its
    files live in the S3 bucket and pull back through the server. Second run: unchanged."""
    import boto3

    checkout, uri, name = ci["checkout"], ci["uri"], "gradtune-mlp-block"
    first = run_workflow(checkout, uri)
    assert first.returncode == 0, first.stderr[-3000:]
    assert outcome(first, name)["outcome"] == "promoted"
    tags = versions(uri, name)["1"]
    assert tags["parent_version"] == "none" and tags["promotion"] == "promoted"
    assert float(tags["tuned_ms"]) > 0 and tags["git_commit"] and len(tags["fingerprint"]) == 16
    assert alias(uri, name, "champion") == "1"

    again = run_workflow(checkout, uri)
    assert again.returncode == 0, again.stderr[-3000:]
    assert outcome(again, name)["outcome"] == "unchanged"
    assert f"{name}: unchanged" in again.stdout and set(versions(uri, name)) == {"1"}

    pulled = run_cli(
        "pull", f"{name}@champion", "--out", str(checkout / "pulled"), "--mlflow-uri", uri,
        cwd=checkout,
    )  # fmt: skip
    assert pulled.returncode == 0, pulled.stderr[-2000:]
    assert json.loads(pulled.stdout)["finite"] is True
    s3 = boto3.client(
        "s3", endpoint_url=ci["s3"], aws_access_key_id="moto", aws_secret_access_key="moto",
        region_name="us-east-1",
    )  # fmt: skip
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="gradtune-mlflow")["Contents"]]
    assert any(k.endswith("artifacts/model.so") for k in keys), keys
    # Nothing went to a local file store: not the client's, not the server's.
    for where in (checkout, ci["home"], ROOT):
        assert not (where / "mlruns").exists() and not (where / "mlartifacts").exists(), where


@pytest.mark.slow
def test_changed_model_is_a_challenger_promoted_only_if_no_slower(ci):
    checkout, uri, name = ci["checkout"], ci["uri"], "gradtune-mlp-block"
    if alias(uri, name, "champion") != "1":
        pytest.skip("needs the champion of the previous test")
    model = checkout / "models" / "mlp_block.py"
    model.write_text(model.read_text().replace("manual_seed(0)", "manual_seed(1)"))
    result = run_workflow(checkout, uri)
    assert result.returncode == 0, result.stderr[-3000:]
    got = outcome(result, name)
    tags = versions(uri, name)[str(got["challenger_version"])]
    assert tags["parent_version"] == "1" and alias(uri, name, "challenger") == "2"
    challenger, champion = (float(tags[f"interleaved_{k}_ms"]) for k in ("challenger", "champion"))
    assert challenger > 0 and champion > 0
    ratio, tolerance = (float(tags[f"interleaved_{k}"]) for k in ("ratio", "tolerance"))
    # The recorded decision is the rule applied to the recorded round-by-round ratio.
    promoted = ratio <= 1 + tolerance
    assert got["outcome"] == tags["promotion"] == ("promoted" if promoted else "kept_champion")
    assert alias(uri, name, "champion") == ("2" if promoted else "1")


@pytest.mark.slow
def test_challenger_failing_verification_is_kept_not_promoted(ci):
    """An exact-equality tolerance no float32 kernel meets: the tuned challenger fails
    verification, is registered with the reason, and exits 4; the champion stays."""
    checkout, uri, name = ci["checkout"], ci["uri"], "gradtune-mlp-block"
    if not versions(uri, name):
        pytest.skip("needs the champion of the previous tests")
    before = alias(uri, name, "champion")
    model = checkout / "models" / "mlp_block.py"
    model.write_text(model.read_text().replace("manual_seed(1)", "manual_seed(2)"))
    config = checkout / "configs" / "models.yaml"
    config.write_text("models:\n  - {path: models/mlp_block.py, rtol: 0, atol_scale: 0}\n")
    # Its 3 default schedules alone: verification fails whatever the search would find.
    result = run_workflow(checkout, uri, trials=3)
    assert result.returncode == 4, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("gradtune: error:")]
    assert len(errors) == 1 and "challenger(s) of gradtune-mlp-block failed" in errors[0]
    got = outcome(result, name)
    assert got["outcome"] == "rejected" and "verification" in got["reason"]
    tags = versions(uri, name)[str(got["challenger_version"])]
    assert tags["promotion"] == "rejected" and "tuned TVM outputs differ" in tags["verify_error"]
    assert alias(uri, name, "champion") == before
    assert alias(uri, name, "challenger") == str(got["challenger_version"])
    # The judge's own check, on files pulled through the server: the first champion was tuned
    # for other weights, so its outputs are not this model's.
    import mlflow

    mlflow.set_tracking_uri(uri)
    first = mlflow.MlflowClient().get_model_version(name, "1")
    decision = promotion.judge(name, first, None, load_model(model))
    assert decision.outcome == "rejected", decision
    assert decision.reason.startswith("registered challenger failed verification")
