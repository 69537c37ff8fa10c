"""gradtune's log lines in Prefect's run logs, and its errors there as one line each.

A flow run started by a Prefect worker is a fresh ``python -m prefect.engine`` process. Prefect
sends the records of its own run loggers to its API (what the UI shows as the run's logs), but
not those of the ``gradtune`` logger, which moreover stops at the root logger's WARNING level.
``to_run_logs`` attaches Prefect's ``APILogHandler`` to ``gradtune`` at INFO for the flow's
duration; it does nothing where that handler is already attached (the CLI names ``gradtune`` in
``PREFECT_LOGGING_EXTRA_LOGGERS``, and keeps its console at WARNING).

Bad input raises ``GradtuneError``, whose message is the whole story, yet Prefect's engines log
every failure with its traceback, and the same exception up to three times (the task run, the
flow run, the engine's exit). ``one_line_user_errors`` keeps of it one record, reduced to
``GradtuneError: <message>``; other failures keep their traceback.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Iterator

from .errors import GradtuneError

RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")  # where Prefect's engines log


class OneLineUserErrors(logging.Filter):
    """Rewrites the first record carrying a given ``GradtuneError`` into one line without its
    traceback, and drops the records that carry it again."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: weakref.WeakSet[BaseException] = weakref.WeakSet()

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, GradtuneError):
            return True
        if exc in self.seen:
            return False
        self.seen.add(exc)
        # "GradtuneError" stays in the text: the CLI's console filter drops such records, since
        # the CLI prints the error itself.
        record.msg, record.args = "%s: %s", (type(exc).__name__, exc)
        record.exc_info = record.exc_text = None
        return True


def one_line_user_errors() -> None:
    """Install ``OneLineUserErrors`` on Prefect's run loggers (once per process; one filter
    for both, so an error the task run logged is not logged again by the flow run).

    It must outlive the flow's body: the engine logs the failure after the body has raised."""
    loggers = [logging.getLogger(name) for name in RUN_LOGGERS]
    if any(isinstance(f, OneLineUserErrors) for f in loggers[0].filters):
        return
    shared = OneLineUserErrors()
    for logger in loggers:
        logger.addFilter(shared)


@contextlib.contextmanager
def to_run_logs(level: int = logging.INFO) -> Iterator[None]:
    """Within a flow run: ``gradtune``'s records at ``level`` and above go to the run's logs."""
    from prefect.logging.handlers import APILogHandler

    logger = logging.getLogger("gradtune")
    if any(isinstance(h, APILogHandler) for h in logger.handlers):
        yield
        return
    handler, previous = APILogHandler(), logger.level
    logger.addHandler(handler)
    if previous == logging.NOTSET or previous > level:
        logger.setLevel(level)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)
