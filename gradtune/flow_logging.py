"""gradtune's log lines in Prefect's run logs, and its errors there as one line each.

A flow run started by a Prefect worker is a fresh ``python -m prefect.engine`` process. Prefect
sends the records of its own run loggers to its API (what the UI shows as the run's logs), but
not those of the ``gradtune`` logger, which moreover stops at the root logger's WARNING level.
``to_run_logs`` attaches Prefect's ``APILogHandler`` to ``gradtune`` at INFO for the flow's
duration; it does nothing where that handler is already attached (the CLI names ``gradtune`` in
``PREFECT_LOGGING_EXTRA_LOGGERS``, and keeps its console at WARNING).

Bad input raises ``GradtuneError``, whose message is the whole story, yet Prefect's engines log
every failure with its traceback. ``one_line_user_errors`` keeps, of such a record, only
``GradtuneError: <message>``; other failures keep their traceback.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from .errors import GradtuneError

RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")  # where Prefect's engines log


class OneLineUserErrors(logging.Filter):
    """Rewrites a record carrying a ``GradtuneError`` into one line without its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, GradtuneError):
            # "GradtuneError" stays in the text: the CLI's console filter drops such records,
            # since the CLI prints the error itself.
            record.msg, record.args = "%s: %s", (type(exc).__name__, exc)
            record.exc_info = record.exc_text = None
        return True


def one_line_user_errors() -> None:
    """Install ``OneLineUserErrors`` on Prefect's run loggers (once per process).

    It must outlive the flow's body: the engine logs the failure after the body has raised."""
    for name in RUN_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, OneLineUserErrors) for f in logger.filters):
            logger.addFilter(OneLineUserErrors())


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
