"""Asking long work to stop between units (a tuning round, a collection batch), and signals.

Work that TVM drives (``tune_tasks``) cannot be interrupted from outside without racing its
scheduler, and an exception raised inside a Python callback that TVM calls crosses the FFI:
per-candidate error handling may swallow it, or the process may crash. So a signal never
raises where TVM may be on the stack. It sets a ``StopSignal`` that the work polls at its own
boundaries (the tuning strategies answer "no more candidates", the scheduler joins what is in
flight), and it is acted on once Python alone is on the stack again.

Two scopes do that:

- ``defer_signals(stop)`` around work that polls ``stop``: SIGINT and SIGTERM set it, and on
  the way out the signal goes to the handler that was there before (KeyboardInterrupt for
  SIGINT, Prefect's cancellation for SIGTERM in a flow run, else the process ends). Nothing
  more: a library caller's process is never ended behind its back.
- ``exit_on_signals()`` around everything a process that runs one tuning job does (the tuning
  flow). Not every wait can be interrupted: the C++ scheduler blocks on a runner's future as
  long as a lost device keeps it, and compiling runs minutes in C++. In such a process a
  signal also arms a deadline: work inside ``defer_signals`` gets ``grace`` seconds to stop and
  unwind (its records written, the RPC fleet stopped), other work none. When it runs out, the
  process exits at once with the shell's code for the signal (128 + its number). What it
  measured is safe: the tuning database is appended a whole line per record (a line cut short
  by the exit is repaired on resume, see ``database_repair``), and its helper processes go
  with it (those of its process group killed on the way out, the RPC fleet by its
  ``lifeline``).

A Python handler runs only when the main thread next executes Python bytecode, which during a
C++ wait may be never; so the process scope also has Python's C-level handler write each
signal's number to a pipe (``signal.set_wakeup_fd``), and a thread waiting on that pipe keeps
the deadline whatever the main thread is doing. That thread still needs the interpreter, so
``gradtune tune`` adds a backstop outside it: the flow runs in a process of its own, which the
CLI relays signals to and kills, with its process group, two seconds after this deadline.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)
GRACE_SECONDS = 5.0  # a stopped run's last batch and unwinding; the CLI kills it at 7 s


@dataclass
class StopSignal:
    stopped: bool = False

    def set(self) -> None:
        self.stopped = True


class _ProcessScope:
    """The state of an ``exit_on_signals`` scope: the first signal, the work that polls a
    ``StopSignal`` right now, and the handlers to hand the signal on to."""

    def __init__(self, grace: float, previous: dict[int, Any], wakeup: int) -> None:
        self.grace = grace
        self.previous = previous
        self.wakeup = wakeup  # write end of the pipe the deadline thread reads
        self.signum: int | None = None
        self.stops: list[StopSignal] = []

    def handle(self, signum: int, frame: Any) -> None:
        # Lock-free: this runs in the main thread between two bytecodes, possibly while that
        # thread holds any lock. The C-level handler has already woken the deadline thread,
        # unless something replaced the wakeup fd since: hence the byte written here too.
        self.note(signum)
        with contextlib.suppress(OSError):
            os.write(self.wakeup, bytes([signum]))

    def note(self, signum: int) -> None:
        """Record ``signum`` (unless a signal came before) and set every ``StopSignal``."""
        if self.signum is None:
            self.signum = signum
        for stop in list(self.stops):
            stop.set()


_process: _ProcessScope | None = None  # the active ``exit_on_signals`` scope, if any


@contextlib.contextmanager
def exit_on_signals(grace: float = GRACE_SECONDS) -> Iterator[None]:
    """While inside, SIGINT and SIGTERM end this process within ``grace`` seconds (see the
    module docstring); the previous handlers come back on exit. Outside the main thread,
    where Python cannot install signal handlers, this does nothing."""
    global _process
    if threading.current_thread() is not threading.main_thread() or _process is not None:
        yield
        return
    import psutil  # noqa: F401  (imported now: the deadline thread may have no time to)

    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    scope = _ProcessScope(grace, {sig: signal.getsignal(sig) for sig in SIGNALS}, write_end)
    for sig in SIGNALS:
        signal.signal(sig, scope.handle)
    old_wakeup = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    # In this thread's context: Prefect sends a log record to its API only from a flow run's.
    deadline = threading.Thread(
        target=contextvars.copy_context().run,
        args=(_keep_deadline, scope, read_end),
        name="gradtune-stop",
        daemon=True,
    )
    _process = scope
    deadline.start()
    try:
        yield
        if scope.signum is not None:  # a signal that no work was there to hand on
            _hand_on(scope.signum, scope.previous[scope.signum])
    finally:
        _process = None
        signal.set_wakeup_fd(old_wakeup)
        for sig, handler in scope.previous.items():
            if handler is not None:  # None: a handler not installed from Python
                signal.signal(sig, handler)
        # After a signal the process is on its way out, and the deadline still holds for what
        # follows (the flow engine's bookkeeping, the interpreter's exit); else the thread,
        # seeing the pipe closed, returns.
        if scope.signum is None:
            os.close(write_end)
            deadline.join(timeout=1)
            os.close(read_end)


def _keep_deadline(scope: _ProcessScope, read_end: int) -> None:
    """The thread behind ``exit_on_signals``: on the first signal, exit the process at once
    unless work is stopping (``defer_signals``), else when its grace runs out."""
    deadline = None
    while True:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not select.select([read_end], [], [], timeout)[0]:
            _exit_now(scope)
        data = os.read(read_end, 64)
        if not data:
            return
        for signum in data:
            if signum not in SIGNALS:
                continue  # the wakeup fd carries every signal that has a Python handler
            scope.note(signum)
            if deadline is None:
                stopping = bool(scope.stops)
                deadline = time.monotonic() + (scope.grace if stopping else 0.0)
                log.warning(
                    "%s: stopping%s; measured records are kept, a rerun with --resume "
                    "continues the run",
                    signal.Signals(scope.signum).name,
                    f" (within {scope.grace:g} s)" if stopping else "",
                )


def _exit_now(scope: _ProcessScope) -> None:
    """Exit with the shell's code for the signal, taking along the descendants in this
    process group (Prefect's temporary server, build and run workers): no cleanup code of
    this process runs after ``os._exit``. Those in groups of their own (the RPC fleet) follow
    by their own lifelines, which also remove their logs."""
    import psutil

    signum = scope.signum or signal.SIGTERM
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    group = os.getpgrp()
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error, OSError):
                if os.getpgid(child.pid) == group:
                    child.kill()
    os._exit(128 + signum)


@contextlib.contextmanager
def defer_signals(stop: StopSignal) -> Iterator[None]:
    """While inside, SIGINT and SIGTERM set ``stop`` and nothing else; on the way out, one
    that came is handed on to the handler that was there before (see the module docstring).

    Inside ``exit_on_signals``, this is the work that scope gives its grace to. Outside it,
    and outside the main thread (where Python cannot install signal handlers), nothing is
    watched.
    """
    scope = _process
    if scope is not None:
        if scope.signum is not None:
            stop.set()
        scope.stops.append(stop)
        try:
            yield
        finally:
            scope.stops.remove(stop)
            if scope.signum is not None:
                _hand_on(scope.signum, scope.previous[scope.signum])
        return
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    seen: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        seen.append(signum)
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            if old is not None:
                signal.signal(sig, old)
        if seen:
            _hand_on(seen[0], previous[seen[0]])


def _hand_on(signum: int, previous: Callable[[int, Any], Any] | int | None) -> None:
    """What ``signum`` would have done had it come now: the previous handler's call (Python's
    raises KeyboardInterrupt, Prefect's a TerminationSignal), else what its default action
    means to Python, KeyboardInterrupt for SIGINT and SystemExit for SIGTERM (exit code 143),
    so that ``finally`` blocks still stop what they started."""
    if callable(previous):
        previous(signum, None)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


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
            if old is not None:  # None: a handler not installed from Python
                signal.signal(sig, old)
