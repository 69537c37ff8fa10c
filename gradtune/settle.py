"""Wait until the other thread pools of this process have stopped spinning.

Every runtime a tuned model is timed against keeps its workers busy for a while after its
last call, so the next call is fast: TVM's workers call ``sched_yield`` up to
``TVM_THREAD_POOL_SPIN_COUNT`` (300,000) times before they sleep, ONNX Runtime's and OpenMP's
spin too. On a machine whose cores the contenders share, a spinning pool slows the next
contender down, and for how long is not fixed. A fixed wait of 0.3 s was enough for ONNX Runtime
after TVM (2-core Zen 3), yet on a 2-core Zen 2, timed beside a tuned TVM library, whole
timings of torch.compile ran 2-3x slower (6 and 20 of 96 blocks in two tries), and none of 96
did with TVM's spinning turned off (``TVM_THREAD_POOL_SPIN_COUNT=0``). Looking is cheaper than
guessing: on Linux each thread's state is in ``/proc/self/task``, and a spinning worker is
running (``R``) where a sleeping one is not.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

TASKS = Path("/proc/self/task")
# Where no thread's state can be read (no /proc): the fixed wait that was enough on a Zen 3.
BLIND_SECONDS = 0.3
POLL_SECONDS = 0.01
QUIET_POLLS = 2  # in a row: a worker between two yields can read as sleeping once
# A thread of the caller's own that never sleeps (a busy server thread) must not stall every
# timing: a spinning pool left alone stops within ~0.1 s (300,000 yields on an idle core).
CAP_SECONDS = 1.0


def running_threads() -> int | None:
    """How many threads of this process, other than the caller, are running or runnable
    (state ``R``); None where the states cannot be read."""
    me = threading.get_native_id()
    try:
        tids = [int(t) for t in os.listdir(TASKS)]
    except OSError:
        return None
    running = 0
    for tid in tids:
        if tid == me:
            continue
        try:
            stat = (TASKS / str(tid) / "stat").read_text()
        except OSError:
            continue  # the thread ended between the listing and the read
        # The name in parentheses may hold spaces or parentheses: the state follows the last ')'.
        if stat.rsplit(")", 1)[1].split()[0] == "R":
            running += 1
    return running


def settle(cap: float = CAP_SECONDS) -> float:
    """Sleep until no other thread of this process has run for ``QUIET_POLLS`` polls in a
    row, at most ``cap`` seconds (``BLIND_SECONDS`` where threads cannot be read); the
    seconds waited."""
    start = time.perf_counter()
    if running_threads() is None:
        time.sleep(BLIND_SECONDS)
        return time.perf_counter() - start
    quiet = 0
    while quiet < QUIET_POLLS and time.perf_counter() - start < cap:
        time.sleep(POLL_SECONDS)
        quiet = quiet + 1 if running_threads() == 0 else 0
    return time.perf_counter() - start
