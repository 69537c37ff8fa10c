"""MetaSchedule's log files, opened by gradtune: MetaSchedule's names and format, warnings on
the console, nothing else of the process touched, one set of files open at a time."""

from __future__ import annotations

import logging
import re

from gradtune.tune_logs import GLOBAL, PREFIX, task_loggers


def test_files_named_as_metaschedule_names_them_and_only_warnings_reach_the_console(
    tmp_path, capsys
):
    # A user's handler elsewhere in the process: MetaSchedule's dictConfig closed it.
    bystander = logging.FileHandler(tmp_path / "user.log")
    logging.getLogger("someone.else").addHandler(bystander)
    first = task_loggers(tmp_path / "a", [f"task{i}" for i in range(11)])
    assert [lg.name for lg in first][:2] == [f"{PREFIX}.task_00_task0", f"{PREFIX}.task_01_task1"]
    first[3].info("a round of task 3")
    logging.getLogger(GLOBAL + ".task_scheduler").info("statistics table")
    logging.getLogger(GLOBAL + ".task_scheduler").warning("a warning")
    logs = tmp_path / "a" / "logs"
    scheduler = (logs / f"{PREFIX}.task_scheduler.log").read_text().splitlines()
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[INFO\] Logging directory: ", scheduler[0])
    assert "statistics table" in scheduler[1] and "[WARNING] a warning" in scheduler[2]
    assert "a round of task 3" in (logs / f"{PREFIX}.task_03_task3.log").read_text()
    out = capsys.readouterr().out
    assert "a warning" in out and "statistics table" not in out and "Logging directory" not in out
    assert bystander.stream is not None and not bystander.stream.closed
    logging.getLogger("someone.else").removeHandler(bystander)
    bystander.close()

    handlers = len(logging.getLogger(GLOBAL).handlers)
    second = task_loggers(tmp_path / "b", ["task0"])
    assert len(logging.getLogger(GLOBAL).handlers) == handlers  # replaced, not added
    assert not first[3].handlers  # the first run's files are closed
    second[0].info("next run")
    assert "next run" in (tmp_path / "b" / "logs" / f"{PREFIX}.task_0_task0.log").read_text()
    assert "next run" not in (logs / f"{PREFIX}.task_00_task0.log").read_text()
