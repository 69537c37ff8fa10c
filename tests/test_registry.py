"""MLflow registry against a real tracking server on 127.0.0.1, pulled back in a fresh process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gradtune import compilation, registry
from gradtune.partition import prepare
from tests.conftest import run_cli


@pytest.mark.slow
def test_register_on_server_and_pull_in_fresh_process(
    mlflow_server, tiny_model, llvm_target, tmp_path
):
    fused = prepare(tiny_model.mod, tiny_model.params, llvm_target)
    lib = compilation.export(compilation.build(fused, llvm_target), tmp_path / "model.so")
    db = tmp_path / "database_workload.json"
    db.write_text("")
    report = tmp_path / "report.md"
    report.write_text("# report\n")
    info = registry.register(
        tracking_uri=mlflow_server,
        registered_name="gradtune-test-mlp",
        alias="champion",
        params={"model": "tiny_mlp", "target": {"kind": "llvm"}},
        round_metrics=[{"best_kernels_us": 10.0}, {"best_kernels_us": 8.0}],
        final_metrics={"tuned_ms": 0.1, "untuned_ms": 0.2},
        lib_path=lib,
        database_files=[db],
        report_files=[report],
        io=registry.io_description(tiny_model.input_names, tiny_model.inputs),
        work_dir=tmp_path,
    )
    assert info["registered"] == "gradtune-test-mlp@champion"

    result = run_cli("pull", "gradtune-test-mlp@champion", "--out", str(tmp_path / "pulled"),
                     "--mlflow-uri", mlflow_server)  # fmt: skip
    assert result.returncode == 0, result.stderr
    pulled = json.loads(result.stdout)
    assert pulled["output_shapes"] == [[4, 16]] and pulled["finite"]

    # The plain MLflow route a deployment would take, also in a fresh process.
    code = (
        "import mlflow, numpy as np;"
        f"mlflow.set_tracking_uri('{mlflow_server}');"
        "m = mlflow.pyfunc.load_model('models:/gradtune-test-mlp@champion');"
        "x = np.load(__import__('sys').argv[1]);"
        "print(np.abs(m.predict(x) - np.load(__import__('sys').argv[2])).max())"
    )
    np_in, np_ref = tmp_path / "x.npy", tmp_path / "ref.npy"
    import numpy as np

    np.save(np_in, tiny_model.inputs[0])
    np.save(np_ref, tiny_model.reference_outputs[0])
    out = subprocess.run([sys.executable, "-c", code, str(np_in), str(np_ref)],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert float(out.stdout.strip().splitlines()[-1]) < 1e-4


def test_pull_errors(tmp_path, capsys):
    import mlflow

    from gradtune.cli import main

    # An empty store: pulling from one that does not exist is refused before MLflow creates it.
    mlflow.MlflowClient("sqlite:///" + str(tmp_path / "m.db")).search_registered_models()
    assert (
        main(
            [
                "pull",
                "no-alias",
                "--out",
                str(tmp_path / "p"),
                "--mlflow-uri",
                "sqlite:///" + str(tmp_path / "m.db"),
            ]
        )
        != 0
    )
    assert "is not NAME@ALIAS" in capsys.readouterr().err
    assert (
        main(
            [
                "pull",
                "ghost@champion",
                "--out",
                str(tmp_path / "p"),
                "--mlflow-uri",
                "sqlite:///" + str(tmp_path / "m.db"),
            ]
        )
        != 0
    )
    assert "no registered model ghost@champion" in capsys.readouterr().err
