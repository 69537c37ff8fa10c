"""bench/peer_fidelity.py: each peer timed alone and beside a tuned library, bad input refused
in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tests.conftest import BENCH, EXAMPLES

sys.path.insert(0, str(BENCH))
import peer_fidelity  # noqa: E402


def run_bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH / "peer_fidelity.py"), *args],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_a_directory_that_is_no_tune_output_is_refused_in_one_line(tmp_path):
    done = run_bench(str(tmp_path), "--model", str(EXAMPLES / "small_cnn.py"))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"peer_fidelity: {tmp_path} has no model.so (not a gradtune tune out dir)"
    ]


def test_a_missing_model_file_is_refused_in_one_line(tmp_path):
    (tmp_path / "model.so").write_bytes(b"")
    (tmp_path / "io.json").write_text("{}")
    done = run_bench(str(tmp_path), "--model", str(tmp_path / "nope.py"))
    assert done.returncode == 2
    assert done.stderr.strip() == f"peer_fidelity: --model {tmp_path / 'nope.py'} is not a file"


@pytest.mark.slow
def test_every_peer_is_timed_in_every_round_both_ways(tiny_model, llvm_target, tmp_path):
    from gradtune import compilation, registry
    from gradtune.partition import prepare

    fused = prepare(tiny_model.mod, tiny_model.params, llvm_target)
    compilation.export(compilation.build(fused, llvm_target), tmp_path / "model.so")
    io = registry.io_description(tiny_model.input_names, tiny_model.inputs)
    (tmp_path / "io.json").write_text(json.dumps(io))
    for mode in ("alone", "beside"):
        args = SimpleNamespace(runs=[tmp_path], model=EXAMPLES / "small_cnn.py",
                               entry="tiny_mlp", rounds=3, mode=mode)  # fmt: skip
        samples = peer_fidelity.one_pass(args)
        assert set(samples) == {"ONNX Runtime", "torch.compile", "PyTorch eager"}, mode
        assert all(len(ms) == 3 and min(ms) > 0 for ms in samples.values()), mode
