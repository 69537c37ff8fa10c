"""Asking long work to stop between units (a tuning round, a collection batch), and Ctrl-C.

Work that TVM drives (``tune_tasks``) cannot be interrupted from outside without racing its
scheduler, and an exception raised inside a TVM callback crosses the FFI as an ordinary error
that per-candidate error handling may swallow. So the signal is a flag the work itself polls
at its own boundaries; signal handlers, time budgets and callers only set it.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


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


@contextlib.contextmanager
def stop_on_signals(stop: StopSignal) -> Iterator[None]:
    """While inside, SIGINT and SIGTERM set ``stop``; a second signal raises KeyboardInterrupt
    to force the way out. The previous handlers come back on exit.

    SIGTERM is handled as SIGINT so that a plain ``kill`` (or DVC stopping a stage) also stops
    the RPC fleet on the normal way out; SIGINT is installed even when it starts out ignored
    (a process started in the background with ``&``), where Python would keep ignoring it.
    Python installs handlers only in the main thread: elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        if stop.stopped:
            raise KeyboardInterrupt
        stop.set()
        log.warning("stopping after the current unit of work (signal %d)", signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            if old is not None:  # None: a handler not installed from Python, nothing to restore
                signal.signal(sig, old)
