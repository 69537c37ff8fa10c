"""Bad input: one line naming the problem, a non-zero exit, and nothing written."""

from __future__ import annotations

import json

import pytest

from gradtune.cli import main
from tests.conftest import EXAMPLES, run_cli

BAD_PY = {
    "no_function.py": "import torch\n",
    "wrong_return.py": "def get_model():\n    return 42\n",
    "not_module.py": "import torch\ndef get_model():\n    return 'x', (torch.randn(1),)\n",
    "unsupported_op.py": (
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return torch.special.bessel_j0(x)\n"
        "def get_model():\n"
        "    return M(), (torch.randn(4, 4),)\n"
    ),
}


def _fail(capsys, argv: list[str], out_dir, fresh_process: bool = False) -> str:
    """Run the CLI; errors found inside the Prefect flow run in a fresh process, as users see
    them (and so Prefect's console handler never binds to pytest's captured stream)."""
    if fresh_process:
        result = run_cli(*argv)
        code, err = result.returncode, result.stderr.strip().splitlines()
        assert not any(line.startswith("Traceback") for line in err), result.stderr
    else:
        code = main(argv)
        err = capsys.readouterr().err.strip().splitlines()
    assert code != 0
    ours = [line for line in err if line.startswith("gradtune: error:")]
    assert len(ours) == 1, err
    assert not out_dir.exists(), "bad input must leave nothing behind"
    return ours[0]


@pytest.fixture
def out(tmp_path):
    return tmp_path / "out"


def test_missing_model(capsys, tmp_path, out):
    line = _fail(capsys, ["tune", str(tmp_path / "missing.py"), "--out", str(out)], out)
    assert "model file not found" in line


def test_invalid_onnx(capsys, tmp_path, out):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00not an onnx protobuf" * 10)
    line = _fail(capsys, ["tune", str(bad), "--out", str(out)], out, fresh_process=True)
    assert "is not a valid ONNX model" in line


@pytest.mark.parametrize(
    "name, message",
    [
        ("no_function.py", "has no function 'get_model'"),
        ("wrong_return.py", "must return (torch.nn.Module, example input tensor(s))"),
        ("not_module.py", "got str as the model"),
        ("unsupported_op.py", "special_bessel_j0"),
    ],
)
def test_bad_python_models(capsys, tmp_path, out, name, message):
    path = tmp_path / name
    path.write_text(BAD_PY[name])
    line = _fail(capsys, ["tune", str(path), "--out", str(out)], out, fresh_process=True)
    assert message in line


def test_unsupported_onnx_operator(capsys, tmp_path, out):
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node("Det", ["x"], ["y"])
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
    )  # fmt: skip
    path = tmp_path / "det.onnx"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.save(model, str(path))
    line = _fail(capsys, ["tune", str(path), "--out", str(out)], out, fresh_process=True)
    assert "Det" in line and "not supported" in line


def test_unknown_target(capsys, out):
    line = _fail(
        capsys, ["tune", str(EXAMPLES / "small_cnn.py"), "--target", "tpu9", "--out", str(out)], out
    )
    assert "TVM does not know the target" in line


@pytest.mark.parametrize(
    "flag, value", [("--trials", "0"), ("--trials", "-5"), ("--time-budget", "0")]
)
def test_non_positive_budget(capsys, out, flag, value):
    line = _fail(
        capsys, ["tune", str(EXAMPLES / "small_cnn.py"), flag, value, "--out", str(out)], out
    )
    assert "must be positive" in line


def test_negative_confirm_is_refused(capsys, out):
    line = _fail(
        capsys, ["tune", str(EXAMPLES / "small_cnn.py"), "--confirm", "-1", "--out", str(out)], out
    )
    assert "--confirm must be 0 or more" in line


def test_out_dir_of_another_model_is_refused(capsys, tmp_path):
    out = tmp_path / "other"
    out.mkdir()
    (out / "run.json").write_text(json.dumps({"model": "other.py", "fingerprint": "abc"}))
    (out / "database_tuning_record.json").write_text("")
    for extra in ([], ["--resume"]):
        code = main(["tune", str(EXAMPLES / "small_cnn.py"), "--out", str(out), *extra])
        err = capsys.readouterr().err
        assert code != 0 and "holds results of another model (other.py)" in err
    assert sorted(p.name for p in out.iterdir()) == ["database_tuning_record.json", "run.json"]


def test_non_gradtune_out_dir_is_refused(capsys, tmp_path):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["tune", str(EXAMPLES / "small_cnn.py"), "--out", str(out)]) != 0
    assert "holds no gradtune results" in capsys.readouterr().err


def test_unreachable_mlflow_uri(capsys, out):
    from gradtune.measure.rpc_fleet import free_port

    uri = f"http://127.0.0.1:{free_port()}"
    line = _fail(
        capsys,
        ["tune", str(EXAMPLES / "small_cnn.py"), "--mlflow-uri", uri, "--out", str(out)],
        out,
    )
    assert f"MLflow tracking URI {uri} cannot be reached" in line


def test_unreachable_tracker(capsys, out):
    from gradtune.measure.rpc_fleet import free_port

    argv = ["tune", str(EXAMPLES / "small_cnn.py"), "--tracker", f"127.0.0.1:{free_port()}",
            "--key", "k", "--out", str(out)]  # fmt: skip
    assert "RPC tracker" in _fail(capsys, argv, out)


def test_reserved_alias(capsys, out):
    line = _fail(
        capsys,
        ["tune", str(EXAMPLES / "small_cnn.py"), "--alias", "latest", "--out", str(out)],
        out,
    )
    assert "reserved by MLflow" in line


@pytest.mark.parametrize(
    ("lowering", "flags"),
    [
        # As a run from before the options were recorded left it: no "lowering" key.
        (None, "--no-fast-math --no-subpixel-conv-transpose"),
        # Tuned in NHWC, resumed in the model's own NCHW: other workloads again.
        ({"weight_prepack": False, "fast_math": True, "conv_layout": "NHWC"},
         "--fast-math --conv-layout NHWC --no-subpixel-conv-transpose"),
        # BatchNorms folded: the convolutions' kernels are other workloads too.
        ({"weight_prepack": False, "fast_math": True, "conv_layout": "NCHW",
          "fold_batchnorm": True}, "--fast-math --fold-batchnorm --no-subpixel-conv-transpose"),
        # Transposed convolutions in TOPI's lowering: other workloads than the phase one.
        ({"weight_prepack": False, "fast_math": True, "conv_layout": "NCHW",
          "fold_batchnorm": False, "subpixel_conv_transpose": False},
         "--fast-math --no-subpixel-conv-transpose"),
    ],
)  # fmt: skip
def test_resuming_with_other_lowering_options_is_refused(capsys, tmp_path, lowering, flags):
    """A directory tuned with libm's functions (or in NHWC) holds other workloads' records
    than the same model in today's default lowering: resuming would quietly start over, so it
    is refused, before any server, with the flags that resume it."""
    from gradtune.frontend import fingerprint
    from gradtune.target import parse_target

    model = str(EXAMPLES / "small_cnn.py")
    out = tmp_path / "run"
    out.mkdir()
    record = {"model": model, "entry": "get_model", "target": parse_target("llvm"),
              "fingerprint": fingerprint(model, "get_model", {})}  # fmt: skip
    if lowering is not None:
        record["lowering"] = lowering
    (out / "run.json").write_text(json.dumps(record))
    code = main(["tune", model, "--out", str(out), "--resume"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1
    assert f"was tuned with {flags}; resume with the same options" in err[0]
    assert [p.name for p in out.iterdir()] == ["run.json"]


def test_cpu_only_lowerings_are_refused_for_a_gpu_target():
    from gradtune.errors import GradtuneError
    from gradtune.job import TuneJob, check_lowering

    job = TuneJob(model="m.onnx", target={"kind": "cuda", "arch": "sm_80"}, weight_prepack=True)
    with pytest.raises(GradtuneError, match="for CPU targets \\(llvm\\), not cuda"):
        check_lowering(job)
    check_lowering(TuneJob(model="m.onnx", target={"kind": "cuda"}, fast_math=True))
    blocked = TuneJob(model="m.onnx", target={"kind": "cuda"}, conv_layout="NCHWc")
    with pytest.raises(GradtuneError, match="NCHWc is for CPU targets \\(llvm\\), not cuda"):
        check_lowering(blocked)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"conv_layout": "nhwc"}, "unknown --conv-layout 'nhwc'; choose one of NCHW"),
        (
            {"warmup": "random"},
            "unknown --warmup 'random'; choose one of model, stake, fresh, skip",
        ),
    ],
)
def test_an_unknown_choice_is_refused_by_a_flow_too(setting, message):
    """The CLI's choices stop a typo; a flow started from Prefect's UI goes through
    ``make_job``, which names it the same way."""
    from gradtune.errors import GradtuneError
    from gradtune.job import make_job

    with pytest.raises(GradtuneError, match=message):
        make_job(None, model=str(EXAMPLES / "small_cnn.py"), **setting)


def test_the_relayed_command_line_keeps_a_negated_flag():
    """``gradtune tune`` reruns itself in its own session from the parsed arguments: an option
    that is on by default and was turned off (``--no-fast-math``) must stay off there."""
    from gradtune.cli import _tune_argv, build_parser

    parser = build_parser()
    model = str(EXAMPLES / "small_cnn.py")
    for flags, fast in (([], True), (["--no-fast-math"], False), (["--fast-math"], True)):
        args = parser.parse_args(["tune", model, "--trials", "8", *flags])
        assert args.fast_math is fast
        relayed = parser.parse_args(_tune_argv(args)[1:])
        assert (relayed.fast_math, relayed.trials, relayed.model) == (fast, 8, model)


def test_the_relayed_command_line_never_holds_the_tracking_uri():
    """A tracking URI may carry a password, and a command line is readable by every user of
    the machine (ps): the relayed tuning process gets the URI in its environment instead."""
    from gradtune.cli import _tune_argv, build_parser

    uri = "http://alice:s3cret@127.0.0.1:5000"
    args = build_parser().parse_args(["tune", str(EXAMPLES / "small_cnn.py"), "--mlflow-uri", uri])
    argv = _tune_argv(args)
    assert not any("s3cret" in item or "mlflow" in item for item in argv), argv


def test_a_job_records_every_lowering_option():
    """What changes the tuned workloads is recorded whole: each ``Lowering`` field, by name."""
    from dataclasses import asdict

    from gradtune.job import TuneJob
    from gradtune.partition import Lowering

    job = TuneJob(model="m.onnx", target={"kind": "llvm"}, fast_math=False, weight_prepack=True)
    assert job.lowering_options() == asdict(Lowering(fast_math=False, weight_prepack=True))
