"""Does a contender's place in an interleaved round change its time? Identical copies, timed.

``compilation.time_rounds`` times every contender once per round, after the cross-core probe
(a parallel launch on TVM's thread pool). A place that costs time would land on one contender
every round. This benchmark times ``--copies`` identical copies of each kind of work in one
pool (as the CLI times two TVM modules, or the peers after theirs):

1. **By place:** ``--timings`` one-round timings in the fixed order; per place, the median of
   its time over the last copy's (1.00: the place costs nothing).
2. **As timed:** ``--timings`` timings of two copies over ``promotion.REPEATS`` rounds as
   ``time_rounds`` runs them now (every other round reversed); the range of the promotion's
   median round-by-round ratio (identical work: near 1.00).

Kinds: a parallel TVM matmul (TVM's pool), NumPy's matmul (its BLAS threads), ONNX Runtime
and PyTorch eager on a small convolution network (their own pools: each block after a pool
switch waits until the last pool's workers stop spinning, ``gradtune.settle``, as the CLI's
timing does).

    .venv/bin/python bench/timing_position.py [--timings 30] [--copies 3]

The last line printed is one JSON object: ``{"kinds": {name: {"by_place": [r1, ...],
"as_timed_range": [lo, hi], "as_timed_median": m}}, "timings": n, "commit": c}``.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
from collections.abc import Callable
from typing import Any

import numpy as np


def tvm_matmul(n: int = 128, calls: int = 2) -> Callable[[], Any]:
    """``calls`` runs of a parallel n×n matmul compiled by TVM (its default schedule, the
    outer loop parallel), on TVM's thread pool."""
    import tvm
    from tvm import te

    a, b = te.placeholder((n, n), name="a"), te.placeholder((n, n), name="b")
    k = te.reduce_axis((0, n), "k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="c")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, b, c]))
    sch.parallel(sch.get_loops(sch.get_sblock("c"))[0])
    fn = tvm.compile(sch.mod, target="llvm")["main"]
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(rng.random((n, n), dtype=np.float32)) for _ in range(3)]
    return lambda: [fn(*args) for _ in range(calls)]


def numpy_matmul(n: int = 96) -> Callable[[], Any]:
    a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    return lambda: [a @ a for _ in range(2)]


def conv_net() -> tuple[Any, Any]:
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 5, 2), torch.nn.ReLU(), torch.nn.Conv2d(32, 64, 3), torch.nn.ReLU()
    ).eval()
    return net, torch.randn(1, 3, 64, 64)


def onnx_runtime(threads: int) -> Callable[[], Any]:
    import torch

    from gradtune import peers

    net, x = conv_net()
    buffer = io.BytesIO()
    torch.onnx.export(net, (x,), buffer, input_names=["x"], dynamo=False)
    return peers.ort_runner(buffer.getvalue(), {"x": x.numpy()}, threads)


def torch_eager(threads: int) -> Callable[[], Any]:
    import torch

    net, x = conv_net()

    def run() -> Any:
        with torch.no_grad():
            return net(x)

    return run


def weigh(make: Callable[[], Callable[[], Any]], pool: str, copies: int, timings: int) -> dict:
    """The two measurements of the module docstring for one kind of work."""
    from gradtune import compilation, promotion

    fns = {f"copy{i}": make() for i in range(copies)}
    pools = {name: pool for name in fns}
    by_place: dict[str, list[float]] = {name: [] for name in fns}
    last = f"copy{copies - 1}"
    for _ in range(timings):
        samples = compilation.time_rounds(fns, 1, min_seconds=0.05, pools=pools).samples
        for name in fns:
            by_place[name].append(samples[name][0] / samples[last][0])
    pair = {"first": fns["copy0"], "second": fns["copy1"]}
    ratios = []
    for _ in range(timings):
        kept = compilation.time_rounds(pair, promotion.REPEATS, pools=pools).kept()
        ratios.append(promotion.decide(kept["first"], kept["second"]).ratio)
    return {
        "by_place": [round(statistics.median(by_place[name]), 3) for name in fns],
        "as_timed_range": [round(min(ratios), 3), round(max(ratios), 3)],
        "as_timed_median": round(statistics.median(ratios), 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timings", type=int, default=30, help="timings per measurement")
    parser.add_argument("--copies", type=int, default=3, help="identical copies timed by place")
    args = parser.parse_args(argv)
    if args.timings < 3:
        parser.exit(2, "timing_position: --timings must be at least 3\n")
    if args.copies < 2:
        parser.exit(2, "timing_position: --copies must be at least 2\n")

    from searchbench.report import git_commit

    from gradtune import compilation, peers
    from gradtune.threads import use_target_threads

    threads = use_target_threads({})  # TVM's pool too: before its first kernel runs
    kinds: dict[str, tuple[Callable[[], Callable[[], Any]], str]] = {
        "tvm": (tvm_matmul, compilation.TVM_POOL),
        "numpy": (numpy_matmul, "numpy"),
        "onnxruntime": (lambda: onnx_runtime(threads), peers.POOLS[peers.ORT]),
        "torch_eager": (lambda: torch_eager(threads), peers.POOLS[peers.EAGER]),
    }
    result: dict[str, Any] = {}
    with peers.torch_threads(threads):
        for name, (make, pool) in kinds.items():
            result[name] = weigh(make, pool, args.copies, args.timings)
            row = result[name]
            print(
                f"{name:12s} by place (over the last copy): "
                f"{' '.join(f'{r:.3f}' for r in row['by_place'])}; as timed, first over "
                f"second: median {row['as_timed_median']:.3f}, range {row['as_timed_range']}",
                flush=True,
            )
    print(json.dumps({"kinds": result, "timings": args.timings, "commit": git_commit()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
