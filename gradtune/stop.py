"""Asking long work to stop between units (a tuning round, a collection batch), and Ctrl-C.

Work that TVM drives (``tune_tasks``) cannot be interrupted from outside without racing its
scheduler, and an exception raised inside a TVM callback crosses the FFI as an ordinary error
that per-candidate error handling may swallow. So the signal is a flag the work itself polls
at its own boundaries; signal handlers, time budgets and callers only set it.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class StopSignal:
    stopped: bool = False

    def set(self) -> None:
        self.stopped = True


def watch_sigint(
    on_interrupt: Callable[[], None] = lambda: None,
) -> tuple[Callable[[], bool], Callable[[], None]]:
    """Record Ctrl-C, call ``on_interrupt``, then behave as before; returns (seen, restore).

    The KeyboardInterrupt alone is not enough: raised inside a Python callback that TVM calls,
    it crosses the FFI as an ordinary error, and code that tolerates errors per candidate (a
    failed build, an unmodelled sketch) can swallow it and work on to the end. ``on_interrupt``
    (typically a ``StopSignal``'s ``set``) gives the work a second, unswallowable way to stop.
    Outside the main thread, where Python cannot install signal handlers, nothing is watched.
    """
    seen = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        return seen.is_set, lambda: None
    previous = signal.getsignal(signal.SIGINT)

    def handler(signum, frame):
        seen.set()
        on_interrupt()
        if callable(previous):
            previous(signum, frame)
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    return seen.is_set, lambda: signal.signal(signal.SIGINT, previous)
