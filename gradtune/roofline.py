"""Where a tuned model's time goes: every task against the machine's measured peak, and the
operators ONNX Runtime runs in the tasks' place.

Per task: GFLOPS (FLOPs / tuned µs), bytes moved and GB/s, each as a share of the machine's
peak. The bytes are the task's PrimFunc buffers (inputs, weights and outputs) counted once: a
lower bound, since intermediates, padding copies and cache re-reads are not counted. The share
of the roofline is the larger of the two shares: a task with arithmetic intensity I can reach
at most min(peak GFLOPS, I × peak GB/s), and its GFLOPS over that is exactly the larger share.

The peak is measured, not taken from a data sheet: a 2048³ fp32 GEMM (the faster of torch.mm
and ONNX Runtime's MatMul, the best of 10 each) and a 256 MiB copy (``Tensor.copy_``, read +
write, the best of 10) on the run's thread count, once per CPU model and thread count, cached
in ``~/.cache/gradtune/peak.json`` (delete the file to measure again, on an idle machine).
Two GEMM libraries, because one alone can miss a CPU's widest vectors: on an AMD EPYC (znver5,
2 threads) torch.mm reached 202 GFLOPS and ONNX Runtime's MatMul 351, and a peak below what a
peer reaches makes every share look better than it is.

ONNX Runtime fuses and reorders nodes by its own rules (``FusedConv``, ``FusedGemm``, NCHWc
reorders) and TVM fuses by its own, so a node-to-task mapping is not sound; the peer's cost is
compared per operator group instead (convolutions, matrix products, softmax, normalisation,
everything else), totalled over the inference on both sides. An elementwise op fused into a
convolution on one side and run alone on the other moves its time between groups.
"""

from __future__ import annotations

import math
import os
import platform
import time
from pathlib import Path
from typing import Any

from . import machine
from .partition import TuningTask, operator_family

GEMM_N = 2048
COPY_BYTES = 256 << 20
PEAK_REPEATS = 10

# ONNX Runtime operator types (as its profiler names them, after fusion) by group; any other
# type (elementwise, pooling, reshapes, NCHWc reorders) is "other".
ORT_GROUPS = {
    "conv": ("Conv", "FusedConv", "NhwcFusedConv", "NhwcConv", "QLinearConv"),
    "conv_transpose": ("ConvTranspose",),
    "matmul": ("MatMul", "Gemm", "FusedGemm", "FusedMatMul", "MatMulInteger", "QGemm"),
    "softmax": ("Softmax", "LogSoftmax"),
    "norm": (
        "LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization",
        "BatchNormalization", "InstanceNormalization", "GroupNormalization",
    ),
}  # fmt: skip
GROUPS = (*ORT_GROUPS, "other")


def ort_group(op_type: str) -> str:
    for group, ops in ORT_GROUPS.items():
        if op_type in ops:
            return group
    return "other"


def task_group(kernel_class: str) -> str:
    """The operator group of a TVM task (``conv2d+add+relu`` → ``conv``)."""
    family = operator_family(kernel_class)
    return {
        "conv2d": "conv",
        "conv3d": "conv",
        "conv2d_transpose": "conv_transpose",
        "matmul": "matmul",
        "softmax": "softmax",
        "norm": "norm",
    }.get(family, "other")


# --------------------------------------------------------------------------- peak


def cache_path() -> Path:
    return machine.cache_dir() / "peak.json"


def machine_peak(threads: int, path: Path | None = None) -> dict[str, Any]:
    """The cached peak of this CPU on ``threads`` threads, measured (and cached) if absent."""
    path = path or cache_path()
    key = machine.machine_key(threads)
    cached = machine.read_cache(path).get(key)
    # Entries from before both GEMMs were measured (no "gemm_gflops") are measured again.
    if isinstance(cached, dict) and {"gflops", "gbps", "gemm_gflops"} <= set(cached):
        return cached
    peak = measure_peak(threads)
    machine.write_cache(path, key, peak)
    return peak


def measure_peak(threads: int) -> dict[str, Any]:
    """fp32 GFLOPS of a large GEMM (the faster library) and GB/s of a large copy, each the best
    of ``PEAK_REPEATS``."""
    import torch

    from .peers import torch_threads

    flops = 2 * GEMM_N**3
    gemm: dict[str, float] = {}
    with torch_threads(threads), torch.no_grad():
        a, b = torch.rand(GEMM_N, GEMM_N), torch.rand(GEMM_N, GEMM_N)
        c = torch.empty(GEMM_N, GEMM_N)
        gemm["torch.mm"] = flops / best_seconds(lambda: torch.mm(a, b, out=c)) / 1e9
        src = torch.rand(COPY_BYTES // 4)
        dst = torch.empty_like(src)
        copy_s = best_seconds(lambda: dst.copy_(src))
    ort_s = ort_gemm_seconds(threads)
    if ort_s is not None:
        gemm["onnxruntime MatMul"] = flops / ort_s / 1e9
    best = max(gemm, key=gemm.__getitem__)
    return {
        "gflops": gemm[best],
        "gbps": 2 * COPY_BYTES / copy_s / 1e9,
        "gemm_gflops": {name: round(value, 1) for name, value in gemm.items()},
        "threads": threads,
        "cpu": machine.cpu_name(),
        "host": platform.node(),
        "measured": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "method": (
            f"fp32 {GEMM_N}^3 GEMM by {best} (the faster of {' and '.join(gemm)}) and a "
            f"{COPY_BYTES >> 20} MiB Tensor.copy_ (bytes read + written), best of "
            f"{PEAK_REPEATS}, torch {torch.__version__}, torch.set_num_threads({threads})"
        ),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def ort_gemm_seconds(threads: int) -> float | None:
    """Best seconds of ONNX Runtime's fp32 ``GEMM_N``³ MatMul on ``threads`` threads; None
    when ONNX Runtime is unavailable."""
    try:
        import numpy as np
        import onnx
        from onnx import TensorProto, helper

        from .peers import ort_runner
    except ImportError:
        return None
    shape = [GEMM_N, GEMM_N]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["A", "B"], ["C"])], "peak_gemm",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("A", "B")],
        [helper.make_tensor_value_info("C", TensorProto.FLOAT, shape)],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    rng = np.random.default_rng(0)
    feed = {n: rng.random(shape, dtype=np.float32) for n in ("A", "B")}
    try:
        run = ort_runner(model.SerializeToString(), feed, threads)
    except ImportError:
        return None
    onnx.checker.check_model(model)
    return best_seconds(run)


def best_seconds(fn, repeats: int = PEAK_REPEATS) -> float:
    fn()  # warm-up: page faults, thread pool start
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


# --------------------------------------------------------------------------- per task


def task_bytes(task: TuningTask) -> int:
    """Bytes of the task's PrimFunc arguments (inputs, weights, outputs), each counted once."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    total = 0
    for info in ArgInfo.from_prim_func(task.mod["main"]):
        n = math.prod(int(d) for d in info.shape)
        total += n * ((int(info.dtype.bits) * int(info.dtype.lanes) + 7) // 8)
    return total


def roofline_row(
    flops: float, nbytes: float, us: float, peak: dict[str, Any] | None
) -> dict[str, float | None]:
    """GFLOPS, GB/s and their shares of ``peak`` for one call moving ``nbytes`` in ``us``."""
    ok = math.isfinite(us) and us > 0
    gflops = flops / us / 1e3 if ok and flops > 0 else None
    gbps = nbytes / us / 1e3 if ok and nbytes > 0 else None
    flops_share = gflops / peak["gflops"] if gflops is not None and peak else None
    bw_share = gbps / peak["gbps"] if gbps is not None and peak else None
    shares = [s for s in (flops_share, bw_share) if s is not None]
    return {
        "gflops": gflops,
        "gbps": gbps,
        "peak_flops_share": flops_share,
        "peak_bw_share": bw_share,
        "roofline_share": max(shares) if shares else None,
    }


def task_rows(
    tasks: list[TuningTask], best_us: dict[str, float], peak: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """One roofline row per task, at its tuned latency (its untuned one where nothing was
    measured: the default schedule is what compiles then)."""
    rows = []
    for t in tasks:
        us = best_us.get(t.name, math.nan)
        if not math.isfinite(us):
            us = t.untuned_us
        nbytes = task_bytes(t)
        rows.append(
            {
                "task": t.name,
                "group": task_group(t.kernel_class),
                "calls": t.weight,
                "mflop": t.flops / 1e6,
                "tuned_us": us if math.isfinite(us) else None,
                "bytes": nbytes,
                **roofline_row(t.flops, nbytes, us, peak),
            }
        )
    return rows


def group_rows(
    task_table: list[dict[str, Any]], ort_op_us: dict[str, float]
) -> list[dict[str, Any]]:
    """Per operator group: TVM's Σ calls × tuned µs, ONNX Runtime's profiled µs per inference
    (None without a profile), and the operator types that made up ONNX Runtime's share."""
    tvm_us = dict.fromkeys(GROUPS, 0.0)
    tvm_tasks: dict[str, int] = dict.fromkeys(GROUPS, 0)
    for row in task_table:
        if row["tuned_us"] is not None:
            tvm_us[row["group"]] += row["calls"] * row["tuned_us"]
        tvm_tasks[row["group"]] += 1
    ort_us = dict.fromkeys(GROUPS, 0.0)
    ort_ops: dict[str, list[str]] = {g: [] for g in GROUPS}
    for op, us in sorted(ort_op_us.items()):
        ort_us[ort_group(op)] += us
        ort_ops[ort_group(op)].append(op)
    return [
        {
            "group": g,
            "tasks": tvm_tasks[g],
            "tuned_us": tvm_us[g],
            "ort_us": ort_us[g] if ort_op_us else None,
            "ort_ops": ort_ops[g],
        }
        for g in GROUPS
        if tvm_tasks[g] or ort_ops[g]
    ]


def summarize(
    tasks: list[TuningTask],
    best_us: dict[str, float],
    peak: dict[str, Any] | None,
    ort_op_us: dict[str, float],
) -> dict[str, Any]:
    """The ``roofline`` entry of ``summary.json``."""
    rows = task_rows(tasks, best_us, peak)
    return {
        "peak": peak,
        "bytes": "PrimFunc arguments (inputs, weights, outputs) counted once: a lower bound",
        "tasks": rows,
        "groups": group_rows(rows, ort_op_us),
        "peer_mapping": (
            "ONNX Runtime's profiled operator times totalled per operator group: its fusions "
            "differ from TVM's, so no node-to-task mapping is sound"
        ),
    }
