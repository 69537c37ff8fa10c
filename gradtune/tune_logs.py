"""MetaSchedule's log files of a tuning run, opened without ``logging.config.dictConfig``.

MetaSchedule's ``get_loggers_from_work_dir`` configures its loggers through ``dictConfig``,
which first flushes and closes every handler of the process. Inside a Prefect flow that
includes Prefect's API log handler, whose flush waits 2.5 s for its queue each time: 5 s of
every tune, before anything is measured. It also closed any handler a user had added.

The files, names and format stay MetaSchedule's: ``work_dir/logs/`` holds
``tvm.s_tir.meta_schedule.logging.task_scheduler.log`` (its global logger: the task
scheduler and everything else of MetaSchedule's) and one
``tvm.s_tir.meta_schedule.logging.task_<i>_<name>.log`` per task.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

GLOBAL = "tvm.s_tir.meta_schedule"
PREFIX = "tvm.s_tir.meta_schedule.logging"  # the module that names MetaSchedule's log files
_FORMAT = logging.Formatter("%(asctime)s [%(levelname)s] %(message)s", "%Y-%m-%d %H:%M:%S")
# The handlers this module attached, closed and replaced by its next call: a process that
# tunes again (tests, a Dask worker) keeps one open file per log, not one per run.
_ours: list[tuple[logging.Logger, logging.Handler]] = []
_console_level: int | None = None


def task_loggers(work_dir: Path, task_names: list[str]) -> list[logging.Logger]:
    """One logger per task writing its own file under ``work_dir/logs``; MetaSchedule's global
    logger writes the task scheduler's file, and its warnings (not its per-round statistics)
    reach the console."""
    log_dir = Path(work_dir) / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    for logger, handler in _ours:
        logger.removeHandler(handler)
        handler.close()
    _ours.clear()

    def attach(logger: logging.Logger, handler: logging.Handler, level: int) -> None:
        handler.setFormatter(_FORMAT)
        handler.setLevel(level)
        logger.addHandler(handler)
        _ours.append((logger, handler))

    glob = logging.getLogger(GLOBAL)
    # The console shows warnings, or less if a user set a higher level before the first tune
    # (from then on the logger is at DEBUG, for the files).
    global _console_level
    if _console_level is None:
        _console_level = max(glob.level, logging.WARNING)
    console = _console_level
    glob.setLevel(logging.DEBUG)
    glob.propagate = False
    attach(glob, logging.StreamHandler(sys.stdout), console)
    attach(glob, logging.FileHandler(log_dir / f"{PREFIX}.task_scheduler.log"), logging.DEBUG)
    width = len(str(len(task_names) - 1))
    loggers = []
    for i, name in enumerate(task_names):
        # MetaSchedule clips a name to 100 characters, against the file system's limit.
        logger = logging.getLogger(f"{PREFIX}.task_{i:0{width}d}_{name[:100]}")
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
        attach(logger, logging.FileHandler(log_dir / f"{logger.name}.log"), logging.DEBUG)
        loggers.append(logger)
    glob.info("Logging directory: %s", log_dir)
    return loggers
