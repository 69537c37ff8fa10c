"""Time a candidate as the model runs it: its input just written by the thread pool.

MetaSchedule times a kernel alone, in a loop (``time_evaluator``): after the first run its
input sits in the caches of the very cores that read it, split the way this kernel splits it.
In a model's inference the input was written a moment ago by the previous kernel, on the
pool's threads, split that kernel's way, so a share of it must cross from another core's cache
first. On a 2-vCPU KVM guest (AMD EPYC Zen 5) that crossing decided which tuned library was
fastest. Nine libraries of one held-out CNN (SqueezeNet-style, 9 kernels), tuned 480 s each by
both searchers: their kernels timed alone summed to 59-77 µs against 92-113 µs end to end, and
ranked the libraries as end to end with a Spearman of 0.08 (0.22 with TVM's cache flush,
which keeps the first argument warm). The same sums with the first argument rewritten by the
pool before each run ranked them 0.86, at 70-92 µs. One 1×1 convolution took 13.9 µs alone and
34-40 µs after its input was written by the pool or by the previous kernel, and the search had
rated it the fastest of its task by that 13.9.

So ``handoff`` times every run right after a preprocessing function (``time_evaluator``'s
``f_preproc``, as TVM's own cache flush) has written the candidate's first argument in place,
split over the pool as a parallel loop splits it. The first argument is the activation by the
convention TVM's flush relies on (a Relax ``call_tir``'s inputs come first, data before
weights); weights stay as the model leaves them, read by the same kernel one inference ago.
Each run is timed singly (``number=1``: a second run would find the input warm again), in
``repeat`` groups of ``RUNS_PER_GROUP``, and the record keeps each group's median.

It is not the default: on a Zen 4 KVM guest (2 vCPUs), three 480 s tunes of that CNN per
searcher timed this way spent 11-13x less device time per run, and their gradient libraries
were 0.915x as fast end to end as those of MetaSchedule's timing, side by side
(``bench/results/search_efficiency_znver4_2threads_alone_handoff.md``). Why is not
measured; on that CPU the README model's inference added only 8% to its kernels timed alone
(``bench/results/vm_breakdown_znver4.md``), so there was less for this timing to correct.

The function lives in the RPC server's process: ``gradtune``'s local fleet registers it
(``measure.fleet_member``); a remote device's server must be started the same way
(``python -m gradtune.measure.fleet_member server ...``), or a candidate fails with a line
saying so. CPU targets only: a GPU kernel's input is in device memory, not a core's cache.
"""

from __future__ import annotations

import functools
import statistics
from typing import Any

PREPROC = "gradtune.handoff_first_arg"
RUNS_PER_GROUP = 15  # single runs per recorded value: their median is steady to a few percent
CPU = 1  # DLPack's kDLCPU
RPC_SESSION_MASK = 128  # a remote device's type carries its session above this (TVM's kRPCSessMask)


@functools.cache
def _rewrite_kernel() -> Any:
    """A compiled kernel writing ``n`` bytes at a pointer back in place, in one parallel loop:
    the pool's threads split them as a model's kernels split a tensor.

    It adds a runtime zero, which no compiler can fold away, so every cache line is written,
    not only read. It takes a bare pointer because in a server's process the argument is a
    bare ``DLTensor*``, which takes no reshaped view.
    """
    import tvm
    from tvm.script import tirx as T

    @T.prim_func
    def rewrite(ptr: T.handle, n: T.int64, zero: T.uint8) -> None:
        T.func_attr({"global_symbol": "rewrite", "tir.noalias": True})
        data = T.decl_buffer((n,), "uint8", data=ptr)
        for i in T.parallel(n):
            data[i] = data[i] + zero

    return tvm.compile(tvm.IRModule({"rewrite": rewrite}), target="llvm")["rewrite"]


def rewrite_first_arg(*args: Any) -> None:
    """``f_preproc``: write the first argument in place from the pool's threads."""
    import ctypes

    import numpy as np

    first = args[0]
    if not first.is_contiguous():
        raise ValueError("--measure handoff: a candidate's first argument is not contiguous")
    nbytes = int(np.prod(first.shape, dtype=np.int64)) * np.dtype(str(first.dtype)).itemsize
    _rewrite_kernel()(ctypes.c_void_p(first.data_ptr()), nbytes, 0)


def register() -> None:
    """Make ``PREPROC`` callable in this process (an RPC server's, before it serves, so that
    each session's fork inherits the compiled kernel too: ~0.05 s once)."""
    import tvm_ffi

    _rewrite_kernel()
    tvm_ffi.register_global_func(PREPROC, rewrite_first_arg, override=True)


def group_medians(results: list[float], groups: int) -> list[float]:
    """``groups`` medians of consecutive runs: what the record keeps (seconds per run)."""
    size = max(1, len(results) // groups)
    return [statistics.median(results[i * size : (i + 1) * size]) for i in range(groups)]


def handoff_run_evaluator(
    session: Any,
    rt_mod: Any,
    device: Any,
    evaluator_config: Any,
    repeated_args: list[Any],
    *,
    ledger: str,
) -> list[float]:
    """``RPCRunner``'s ``f_run_evaluator``: ``evaluator_config.repeat`` group medians of
    ``RUNS_PER_GROUP`` single runs, each after its first argument was rewritten by the pool."""
    from .adaptive import HANDOFF, Timing, write_ledger

    if device.dlpack_device_type() % RPC_SESSION_MASK != CPU:
        raise RuntimeError("--measure handoff times CPU kernels only; use --measure fixed")
    try:
        session.get_function(PREPROC)
    except Exception as err:  # TVM raises a plain error for a name the server lacks
        raise RuntimeError(
            f"the RPC server has no {PREPROC}: start it with `python -m "
            "gradtune.measure.fleet_member server ...`, or use --measure fixed"
        ) from err
    groups = max(1, int(evaluator_config.repeat))
    runs = groups * RUNS_PER_GROUP
    evaluator = rt_mod.time_evaluator(
        rt_mod.entry_name, device, number=1, repeat=runs, min_repeat_ms=0, f_preproc=PREPROC
    )
    device.sync()
    results = [float(x) for x in evaluator(*repeated_args[0]).results]
    run_secs = group_medians(results, groups)
    write_ledger(ledger, Timing(run_secs, runs, sum(results), HANDOFF))
    return run_secs
