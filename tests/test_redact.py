"""Credentials never shown: URIs redacted, secrets in the environment nowhere in the output."""

from __future__ import annotations

import pytest

from gradtune.measure.rpc_fleet import free_port
from gradtune.redact import redact_uri
from tests.conftest import EXAMPLES, run_cli


@pytest.mark.parametrize(
    "uri, shown",
    [
        ("http://user:s3cret@mlflow.example:5000", "http://user:***@mlflow.example:5000"),
        ("https://user:p%40ss@host/prefix/", "https://user:***@host/prefix/"),
        ("https://ghp_T0KEN@host", "https://***@host"),
        ("postgresql+psycopg2://ml:pw@db:5432/mlflow", "postgresql+psycopg2://ml:***@db:5432/mlflow"),
        ("https://host/api?token=abc&x=1", "https://host/api?token=***&x=1"),
        ("https://h/?X-Amz-Signature=f00&X-Amz-Credential=AKIA", "https://h/?X-Amz-Signature=***&X-Amz-Credential=***"),
        ("https://host:8443/mlflow", "https://host:8443/mlflow"),
        ("sqlite:////tmp/runs/mlflow.db", "sqlite:////tmp/runs/mlflow.db"),
        ("databricks", "databricks"),
        ("http://[::1", "http://[::1"),  # not a URI: unchanged
    ],
)  # fmt: skip
def test_redact_uri(uri, shown):
    assert redact_uri(uri) == shown


def test_secrets_never_in_the_output_of_a_failed_run(tmp_path):
    """A password in the MLflow URI and an AWS secret in the environment, on a run refused
    for its unreachable MLflow server: the error names the server, never the secrets."""
    secret, password = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY", "hunter2-pw"
    uri = f"http://gradtune:{password}@127.0.0.1:{free_port()}"
    result = run_cli("tune", str(EXAMPLES / "small_cnn.py"), "--mlflow-uri", uri,
                     "--out", str(tmp_path / "out"), env={"AWS_SECRET_ACCESS_KEY": secret},
                     timeout=60)  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "gradtune:***@127.0.0.1" in output
    assert secret not in output and password not in output
