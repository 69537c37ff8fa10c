"""One way to ask long work to stop between units: a tuning round, a collection batch.

Work that TVM drives (``tune_tasks``) cannot be interrupted from outside without racing its
scheduler, and an exception raised inside a TVM callback crosses the FFI as an ordinary error
that per-candidate error handling may swallow. So the signal is a flag the work itself polls
at its own boundaries; signal handlers, time budgets and callers only set it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StopSignal:
    stopped: bool = False

    def set(self) -> None:
        self.stopped = True
