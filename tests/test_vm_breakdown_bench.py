"""bench/vm_breakdown.py: a compiled model's inference against its kernels timed alone, and
bad input refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import BENCH, ROOT

sys.path.insert(0, str(BENCH))
import vm_breakdown  # noqa: E402


def test_every_kernel_the_inference_calls_is_timed_alone_on_the_inference_own_tensors(
    tiny_model, llvm_target, tmp_path
):
    from gradtune import compilation, registry
    from gradtune.partition import prepare

    fused = prepare(tiny_model.mod, tiny_model.params, llvm_target)
    compilation.export(compilation.build(fused, llvm_target), tmp_path / "model.so")
    io = registry.io_description(tiny_model.input_names, tiny_model.inputs)
    (tmp_path / "io.json").write_text(json.dumps(io))
    record = vm_breakdown.time_library(tmp_path, rounds=3, with_perf=False)
    # The tiny MLP's matmuls and epilogues are kernels; allocation and checks are builtins.
    assert record["kernel_calls"] >= 2 and record["builtin_calls"] >= 1
    assert len(record["e2e_us"]) == len(record["kernels_us"]) == 3
    assert all(k > 0 for k in record["kernels_us"]) and all(e > 0 for e in record["e2e_us"])


@pytest.mark.parametrize(
    "args, says",
    [
        (["no/such/run"], "no/such/run has no model.so"),
        (["RUN", "--passes", "2"], "--passes must be at least 3"),
        (["RUN", "--threads", "0"], "--threads must be positive"),
    ],
)
def test_bad_input_is_refused_in_one_line(tmp_path, args, says):
    for name in ("model.so", "io.json"):  # names the checks look for; never loaded
        (tmp_path / name).write_text("")
    args = [str(tmp_path) if a == "RUN" else a for a in args]
    done = subprocess.run(
        [sys.executable, str(BENCH / "vm_breakdown.py"), *args],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr
    assert done.stdout == ""
