"""MLflow registry against a real tracking server on 127.0.0.1, pulled back in a fresh process."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import warnings

import pytest

from gradtune import compilation, integrity, registry
from gradtune.errors import GradtuneError
from gradtune.partition import prepare
from tests.conftest import run_cli


@pytest.mark.slow
def test_register_on_server_and_pull_in_fresh_process(
    mlflow_server, tiny_model, llvm_target, tmp_path
):
    fused = prepare(tiny_model.mod, tiny_model.params, llvm_target)
    lib = compilation.export(compilation.build(fused, llvm_target), tmp_path / "model.so")
    (tmp_path / "database_workload.json").write_text("")
    (tmp_path / "report.md").write_text("# report\n")
    registration = registry.Registration(
        registered_name="gradtune-test-mlp",
        alias="champion",
        params={"model": "tiny_mlp", "target": {"kind": "llvm"}},
        round_metrics=[{"best_kernels_us": 10.0}, {"best_kernels_us": 8.0}],
        final_metrics={"tuned_ms": 0.1, "untuned_ms": 0.2},
        lib=lib.name,
        database_files=["database_workload.json"],
        report_files=["report.md"],
        io=registry.io_description(tiny_model.input_names, tiny_model.inputs),
    )
    info = registry.register(registration, mlflow_server, tmp_path)
    assert info["registered"] == "gradtune-test-mlp@champion"
    import mlflow

    tags = (
        mlflow.MlflowClient(mlflow_server)
        .get_model_version("gradtune-test-mlp", info["version"])
        .tags
    )
    assert tags["sha256/artifacts/model.so"] == integrity.sha256_file(lib)

    result = run_cli("pull", "gradtune-test-mlp@champion", "--out", str(tmp_path / "pulled"),
                     "--mlflow-uri", mlflow_server)  # fmt: skip
    assert result.returncode == 0, result.stderr
    pulled = json.loads(result.stdout)
    assert pulled["output_shapes"] == [[4, 16]] and pulled["finite"] and pulled["verified"]

    # The plain MLflow route a deployment would take, also in a fresh process, with each of
    # the input forms the served model takes: an array, a list in input order, a dict by name.
    code = (
        "import sys, mlflow, numpy as np;"
        f"mlflow.set_tracking_uri('{mlflow_server}');"
        "m = mlflow.pyfunc.load_model('models:/gradtune-test-mlp@champion');"
        "x, ref = np.load(sys.argv[1]), np.load(sys.argv[2]);"
        "outs = [m.predict(x), m.predict([x]), m.predict({sys.argv[3]: x})];"
        "print(max(float(np.abs(o - ref).max()) for o in outs))"
    )
    np_in, np_ref = tmp_path / "x.npy", tmp_path / "ref.npy"
    import numpy as np

    np.save(np_in, tiny_model.inputs[0])
    np.save(np_ref, tiny_model.reference_outputs[0])
    out = subprocess.run([sys.executable, "-c", code, str(np_in), str(np_ref),
                          tiny_model.input_names[0]],
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


def _registration(run_dir, alias="champion"):
    """A run directory's files for the registry alone: it stores and digests them, never loads
    the library (the slow tests register and load a compiled one)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "model.so").write_bytes(b"library bytes")
    (run_dir / "database_workload.json").write_text('{"workload": 1}\n')
    (run_dir / "database_tuning_record.json").write_text("[0, [[], [1.0]]]\n")
    (run_dir / "report.md").write_text("# report\n")
    return registry.Registration(
        registered_name="reg-test",
        alias=alias,
        lib="model.so",
        database_files=["database_tuning_record.json", "database_workload.json"],
        report_files=["report.md"],
        io={"device": "cpu", "inputs": [{"name": "x", "shape": [1], "dtype": "float32"}]},
    )


def test_alias_failure_leaves_no_version(tmp_path):
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # MLflow refuses the alias only after the version exists: the step that must not leave
    # a version without the alias the caller asked for.
    with pytest.raises(mlflow.exceptions.MlflowException, match="reserved"):
        registry.register(_registration(tmp_path / "run", alias="latest"), uri, tmp_path / "run")
    assert mlflow.MlflowClient(uri).search_model_versions("name = 'reg-test'") == []


def test_pull_refuses_changed_and_unverified_files(tmp_path):
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_dir = tmp_path / "run"
    logged: list[str] = []
    keep = logging.Handler()
    keep.emit = lambda record: logged.append(record.getMessage())
    logging.getLogger("mlflow.pyfunc").addHandler(keep)  # MLflow's loggers do not propagate
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            info = registry.register(_registration(run_dir), uri, run_dir)
    finally:
        logging.getLogger("mlflow.pyfunc").removeHandler(keep)
    # MLflow's nudge to type predict(), once on every tune's console, is answered, and its
    # notice that the hint gives no signature is not shown.
    assert not [w for w in caught if "type hints" in str(w.message)]
    assert not [m for m in logged if "signature" in m], logged
    client = mlflow.MlflowClient(uri)
    tags = client.get_model_version("reg-test", info["version"]).tags
    for name in ("model.so", "database_tuning_record.json", "database_workload.json"):
        assert tags[f"sha256/artifacts/{name}"] == integrity.sha256_file(run_dir / name)
    assert {"sha256/MLmodel", "sha256/serving.py", "sha256/artifacts/checksums.json"} <= set(tags)

    (stored,) = (tmp_path / "mlartifacts").rglob("artifacts/model.so")
    stored.write_bytes(b"another library")
    out = tmp_path / "pulled"
    with pytest.raises(GradtuneError, match=r"^model.so of reg-test@champion does not match its "
                       r"registered SHA-256 .*nothing was loaded$"):  # fmt: skip
        registry.pull("reg-test@champion", out, uri)
    assert list(out.iterdir()) == [], "a refused download leaves no file behind"

    (stored.parent / "extra.so").write_bytes(b"x")
    stored.write_bytes(b"library bytes")
    with pytest.raises(GradtuneError, match="extra.so of reg-test@champion is not one of its"):
        registry.pull("reg-test@champion", out, uri)

    for key in tags:
        client.delete_model_version_tag("reg-test", info["version"], key)
    with pytest.raises(GradtuneError, match="without SHA-256 checksums.*--allow-unverified"):
        registry.pull("reg-test@champion", out, uri)


def test_manifest_mismatches():
    expected = {"MLmodel": "a" * 64, "artifacts/model.so": "b" * 64}
    assert integrity.mismatches(expected, dict(expected)) == []
    found = {"MLmodel": "a" * 64, "artifacts/model.so": "c" * 64, "artifacts/x.so": "d" * 64}
    assert [path for path, _ in integrity.mismatches(expected, found)] == [
        "artifacts/model.so",
        "artifacts/x.so",
    ]
    assert integrity.mismatches(expected, {"MLmodel": "a" * 64}) == [
        ("artifacts/model.so", "is missing")
    ]


def test_register_dir_without_a_finished_run(tmp_path):
    from gradtune.pipeline import register_run_dir

    with pytest.raises(GradtuneError, match="no finished run to register"):
        register_run_dir(tmp_path, None)
    _registration(tmp_path).save(tmp_path)
    (tmp_path / "model.so").unlink()
    with pytest.raises(GradtuneError, match="model.so is missing: nothing to register"):
        register_run_dir(tmp_path, None)


def test_the_printed_pull_command_stays_on_one_line_whatever_the_uri_length(capsys):
    from gradtune import pipeline

    uri = "sqlite:///" + "/very-long-directory-name" * 8 + "/mlflow.db"
    pipeline.print_summary({
        "untuned_ms": 4.0, "tuned_ms": 0.1, "reference": "PyTorch eager", "reference_ms": 0.5,
        "peers": {}, "speedup_vs_reference": 5.0, "max_abs_err": 1e-8, "total_trials": 8,
        "registered": "m@champion", "mlflow_uri": uri,
    })  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    pull = [line for line in lines if line.startswith("pull it: ")]
    assert pull == [f"pull it: gradtune pull m@champion --out DIR --mlflow-uri {uri}"]
