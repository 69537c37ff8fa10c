"""How many threads TVM's runtime runs a kernel on: the target's cores, not half of them.

TVM's runtime sizes a thread pool when a thread first launches a parallel kernel, from
``TVM_NUM_THREADS`` (else ``OMP_NUM_THREADS``) and, without either, from
``std::thread::hardware_concurrency()`` halved on x86 on the assumption of two hyper-threads per
core (``threading_backend.cc``, ``MaxConcurrency``). On a machine without SMT, as most cloud
VMs (one vCPU per core), that is half the cores. On a 2-core Zen 3 VM every candidate timed over
RPC and every tuned model timed against the peers ran its kernels on one thread while ONNX
Runtime and PyTorch ran on two: a tuned 3x3 convolution timed 75 us on one thread and 37 us on
two, and the search, rewarded by one-thread timings, preferred schedules that gain nothing
from a second core.

So importing gradtune sets ``TVM_NUM_THREADS`` to this machine's physical cores (the default
target's ``num-cores``), before any kernel can run in the process; a run whose target names
another ``num-cores`` sets that (``use_target_threads``). The processes gradtune starts, its local
RPC servers among them, inherit it, and the peers run on the same count. A ``TVM_NUM_THREADS`` or
``OMP_NUM_THREADS`` the user set wins. A remote device's RPC server sizes its own pool: start it
with ``TVM_NUM_THREADS`` set to the device's cores.
"""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger("gradtune")

ENV = "TVM_NUM_THREADS"
USER_ENVS = (ENV, "OMP_NUM_THREADS")  # TVM's own order of precedence
_ours: str | None = None  # the value this module wrote: while it stands, no user's choice


def user_threads() -> int | None:
    """The thread count the user chose for TVM's runtime in the environment, if any."""
    for name in USER_ENVS:
        value = os.environ.get(name, "").strip()
        if name == ENV and value and value == _ours:
            continue
        if value:
            try:
                return max(int(value), 1)  # TVM's own atoi, floored at one thread
            except ValueError:
                return 1  # atoi of text is 0: TVM then runs on one thread
    return None


def host_cores() -> int:
    """This machine's physical cores (logical ones where psutil cannot tell)."""
    import psutil

    return int(psutil.cpu_count(logical=False) or psutil.cpu_count() or 1)


def target_threads(target_config: dict[str, Any]) -> int:
    """The thread count kernels of ``target_config`` run on here, and the peers with them:
    the user's choice in the environment, else the target's ``num-cores``, else (a GPU
    target) this machine's physical cores."""
    chosen = user_threads()
    if chosen is not None:
        return chosen
    cores = target_config.get("num-cores")
    return int(cores) if cores else host_cores()


def use_target_threads(target_config: dict[str, Any]) -> int:
    """Make TVM's runtime in this process, and in the processes it starts from now on (the
    local RPC servers), run kernels on ``target_threads(target_config)`` threads; return it.
    ``{}`` (no ``num-cores``) stands for this machine's physical cores.

    Call it before this process runs any TVM kernel: a thread's pool, once made, keeps its
    size (a Prefect worker's thread that ran an earlier flow keeps that flow's count)."""
    global _ours
    threads = target_threads(target_config)
    if user_threads() is None:
        os.environ[ENV] = _ours = str(threads)
        log.debug("TVM runtime threads: %d", threads)
    return threads


def runtime_threads() -> int:
    """The size of the pool TVM's runtime runs the calling thread's kernels on (made now, from
    the environment, if the thread has none yet)."""
    import tvm

    return int(tvm.get_global_func("runtime.NumThreads")())
