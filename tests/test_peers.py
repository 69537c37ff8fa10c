"""The peers a tuned model is compared with, the roofline arithmetic and the cached peak."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from gradtune import machine, peers, roofline
from gradtune.frontend import ImportedModel, load_model
from gradtune.partition import extract, prepare
from tests.conftest import ROOT


def test_roofline_row_divides_by_the_latency_and_takes_the_larger_share():
    peak = {"gflops": 400.0, "gbps": 50.0}
    # 2 GFLOP and 100 MB in 10 ms: 200 GFLOPS (half the peak), 10 GB/s (a fifth).
    row = roofline.roofline_row(2e9, 1e8, 1e4, peak)
    assert row["gflops"] == pytest.approx(200.0) and row["gbps"] == pytest.approx(10.0)
    assert row["peak_flops_share"] == pytest.approx(0.5)
    assert row["peak_bw_share"] == pytest.approx(0.2)
    assert row["roofline_share"] == pytest.approx(0.5)
    # A copy: no FLOPs, so its bandwidth share is its roofline share.
    copy = roofline.roofline_row(0.0, 1e8, 1e4, peak)
    assert copy["gflops"] is None and copy["roofline_share"] == pytest.approx(0.2)
    unknown = roofline.roofline_row(1e6, 1e6, math.nan, peak)
    assert all(v is None for v in unknown.values())
    no_peak = roofline.roofline_row(2e9, 1e8, 1e4, None)
    assert no_peak["gflops"] == pytest.approx(200.0) and no_peak["roofline_share"] is None


def test_task_bytes_count_every_argument_once(tiny_model, llvm_target):
    tasks = {t.kernel_class: t for t in extract(prepare(tiny_model.mod, tiny_model.params,
                                                        llvm_target), llvm_target)}  # fmt: skip
    # x[4,64] @ W[64,128] + b[128] -> y[4,128], float32.
    assert roofline.task_bytes(tasks["matmul+add+relu"]) == 4 * (4 * 64 + 64 * 128 + 128 + 4 * 128)
    rows = roofline.task_rows(list(tasks.values()), {}, {"gflops": 100.0, "gbps": 10.0})
    assert {r["group"] for r in rows} == {"matmul"}
    assert all(r["tuned_us"] is None and r["gflops"] is None for r in rows)  # nothing measured
    # A task never measured in the search compiles its default: its untuned latency counts.
    tuned, untuned = tasks["matmul+add+relu"], tasks["matmul+add"]
    untuned.untuned_us = 2.0
    rows = {r["task"]: r for r in roofline.task_rows([tuned, untuned], {tuned.name: 0.5}, None)}
    assert rows[tuned.name]["tuned_us"] == 0.5 and rows[untuned.name]["tuned_us"] == 2.0
    assert rows[tuned.name]["gflops"] == pytest.approx(tuned.flops / 0.5 / 1e3)
    assert rows[untuned.name]["gbps"] == pytest.approx(roofline.task_bytes(untuned) / 2.0 / 1e3)


def test_operator_groups_total_both_sides_per_inference():
    assert roofline.task_group("conv2d+add+relu") == "conv"
    assert roofline.task_group("conv2d_transpose+add") == "conv_transpose"
    assert roofline.task_group("matmul+add") == "matmul"
    assert roofline.task_group("concatenate") == "other"
    assert roofline.ort_group("FusedConv") == "conv" and roofline.ort_group("Concat") == "other"
    table = [
        {"group": "conv", "calls": 2, "tuned_us": 10.0},
        {"group": "conv", "calls": 1, "tuned_us": 5.0},
        {"group": "other", "calls": 1, "tuned_us": 3.0},
        {"group": "other", "calls": 1, "tuned_us": None},  # not measured: counted, no time
    ]
    ort_us = {"FusedConv": 7.0, "Conv": 1.0, "Relu": 0.5, "Gemm": 2.0}
    groups = {g["group"]: g for g in roofline.group_rows(table, ort_us)}
    assert groups["conv"]["tuned_us"] == 25.0 and groups["conv"]["tasks"] == 2
    assert groups["conv"]["ort_us"] == 8.0 and groups["conv"]["ort_ops"] == ["Conv", "FusedConv"]
    assert groups["other"]["tuned_us"] == 3.0 and groups["other"]["ort_us"] == 0.5
    assert groups["matmul"]["tasks"] == 0 and groups["matmul"]["ort_us"] == 2.0
    assert "softmax" not in groups
    unprofiled = roofline.group_rows(table, {})
    assert all(g["ort_us"] is None for g in unprofiled)


def test_op_times_are_medians_over_the_runs_after_the_warm_up():
    def run(ts):
        return {"cat": "Session", "name": "model_run", "ts": ts, "dur": 90}

    def node(ts, op, dur):
        return {"cat": "Node", "name": f"n{ts}_kernel_time", "ts": ts, "dur": dur,
                "args": {"op_name": op}}  # fmt: skip

    events = [
        run(0), node(1, "Conv", 1000),  # the warm-up
        run(100), node(101, "Conv", 10), node(102, "Relu", 2), node(103, "Relu", 2),
        run(200), node(201, "Conv", 30), node(202, "Relu", 6),
        run(300), node(301, "Conv", 500), node(302, "Relu", 1),  # a burst: the median skips it
        node(450, "Conv", 7),  # outside every inference
    ]  # fmt: skip
    assert peers.op_times(events, skip_runs=1) == {"Conv": 30.0, "Relu": 4.0}
    assert peers.op_times(events, skip_runs=4) == {}


def test_peak_is_measured_once_and_cached_per_cpu_and_thread_count(tmp_path):
    path = tmp_path / "gradtune" / "peak.json"
    path.parent.mkdir()
    path.write_text("{not json")  # a damaged cache is measured over, not fatal
    peak = roofline.machine_peak(1, path)
    assert peak["gflops"] > 1 and peak["gbps"] > 0.1 and peak["threads"] == 1
    assert "torch.mm" in peak["method"] and "set_num_threads(1)" in peak["method"]
    # The faster of two GEMM libraries is the peak, and both are on record.
    assert set(peak["gemm_gflops"]) == {"torch.mm", "onnxruntime MatMul"}
    assert peak["gflops"] == pytest.approx(max(peak["gemm_gflops"].values()), rel=1e-3)
    assert json.loads(path.read_text()) == {machine.machine_key(1): peak}
    assert roofline.machine_peak(1, path) == peak  # read back: a new measurement would differ

    other = {"gflops": 123.0, "gbps": 4.5, "gemm_gflops": {"x": 123.0}, "method": "seeded"}
    path.write_text(json.dumps({machine.machine_key(1): peak, machine.machine_key(7): other}))
    assert roofline.machine_peak(7, path) == other


def test_pytorch_model_has_all_three_peers_on_the_given_threads(tiny_model):
    with peers.torch_threads(1):
        found = peers.build_peers(tiny_model, 1)
        assert torch.get_num_threads() == 1
        assert found.errors() == {}
        assert set(found.runnable()) == set(peers.PEER_NAMES)
        ops = found.ort_op_us(runs=5)
    assert ops and all(us > 0 for us in ops.values())
    assert {roofline.ort_group(op) for op in ops} == {"matmul"}


def test_onnx_model_without_a_pytorch_twin_says_why(tiny_onnx):
    model = load_model(tiny_onnx)
    with peers.torch_threads(1):
        found = peers.build_peers(model, 1)
    assert peers.ORT in found.runnable()
    try:
        import onnx2torch  # noqa: F401
    except ImportError:
        for name in (peers.TORCH_COMPILE, peers.EAGER):
            assert "onnx2torch" in found.errors()[name] and "not installed" in found.errors()[name]
    else:
        assert set(found.runnable()) == set(peers.PEER_NAMES)


def twin(module: torch.nn.Module, x: torch.Tensor) -> ImportedModel:
    """What the frontend records of a PyTorch model, without its (here unused) Relax form."""
    with torch.no_grad():
        ref = module(x)
    return ImportedModel(
        name=type(module).__name__, framework="pytorch", mod=None, params={},
        inputs=[x.numpy()], reference_outputs=[ref.numpy()], run_reference=lambda: module(x),
        input_names=["input0"], source=module,
    )  # fmt: skip


NO_EXPORT_NO_COMPILER = """
import json, torch
from gradtune import peers
from tests.test_peers import twin

class Spectrum(torch.nn.Module):
    # No ONNX exporter converts rfft; PyTorch runs it.
    def forward(self, x):
        return torch.relu(torch.fft.rfft(x).abs() * 2.0 - 1.0)

model = twin(Spectrum(), torch.randn(2, 16))
with peers.torch_threads(1):
    found = peers.build_peers(model, 1)
print(json.dumps({"errors": found.errors(), "runnable": list(found.runnable()),
                  "onnx": found.onnx is not None, "ort_ops": found.ort_op_us()}))
"""


def test_a_peer_that_cannot_run_gets_its_reason_and_the_others_run():
    # A machine without a C++ compiler (inductor reads CXX; its caches off, so nothing compiled
    # before stands in), and a model no ONNX exporter converts. A process of its own: inductor
    # keeps what it learnt of the compiler.
    env = {**os.environ, "CXX": "no-such-compiler", "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", NO_EXPORT_NO_COMPILER], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    errors = found["errors"]
    assert "torch.onnx.export failed" in errors[peers.ORT] and "fft" in errors[peers.ORT]
    assert "C++ compiler" in errors[peers.TORCH_COMPILE], errors[peers.TORCH_COMPILE]
    assert found["runnable"] == [peers.EAGER]
    assert not found["onnx"] and found["ort_ops"] == {}


def test_a_peer_that_computes_something_else_is_not_compared():
    model = twin(torch.nn.Linear(8, 4).eval(), torch.randn(3, 8))
    model.reference_outputs = [model.reference_outputs[0] + 1.0]  # another network's outputs
    with peers.torch_threads(1):
        found = peers.build_peers(model, 1)
    assert found.runnable() == {}
    assert all("differ from the reference" in e for e in found.errors().values()), found.errors()
