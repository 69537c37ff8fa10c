"""Making a JSONDatabase that a crash left torn readable again, before a run resumes from it.

MetaSchedule's JSONDatabase is two files of one JSON document per line, appended a line at a
time: workloads (``database_workload.json``) and tuning records
(``database_tuning_record.json``, each ``[workload line number, record]``). A process killed
mid-append leaves a last line cut short, without its newline. TVM then refuses the whole
database (``parallel_for_dynamic error with Unexpected end of string``, naming neither file
nor line), and the next append would glue a whole line onto the fragment. An empty line, or a
record with an infinite latency (which TVM writes as ``inf`` but cannot read back), is as
fatal.

So the lines TVM could not read are dropped, counted and logged, and a last line that is whole
gets back its missing newline. The two files are not treated alike: a record is independent of
every other, so any unreadable one can go, but records name their workload by its line number,
so a workload line can go only when it is the last one (written, then cut, before any record
of it). An unreadable workload line further up is refused, naming the file and line: dropping
it would move every record after it onto the wrong workload. Records whose workload line is
gone are dropped as well.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from .errors import GradtuneError

log = logging.getLogger(__name__)


def repair_database(path_workload: Path, path_tuning_record: Path) -> dict[Path, int]:
    """Repair the two files in place (when they need it); returns the lines dropped per file.

    Files that do not exist are left alone (a new run creates them).
    """
    dropped: dict[Path, int] = {}
    workloads = None
    if path_workload.exists():
        lines, bad_lines, torn = _read_lines(path_workload)
        if bad_lines:
            raise GradtuneError(
                f"{path_workload}:{bad_lines[0]} is not a readable workload, and records "
                "refer to workloads by line number, so it cannot be dropped; move the "
                "database files away to start the run over"
            )
        workloads = len(lines)
        dropped[path_workload] = _rewrite(path_workload, lines, torn)
    if path_tuning_record.exists():
        lines, bad_lines, torn = _read_lines(path_tuning_record)
        kept = [line for line in lines if _names_workload(line, workloads)]
        dropped[path_tuning_record] = _rewrite(
            path_tuning_record, kept, torn + len(bad_lines) + len(lines) - len(kept)
        )
    for path, count in dropped.items():
        if count:
            log.warning("repaired %d torn line(s) in %s", count, path)
    return {path: count for path, count in dropped.items() if count}


def _read_lines(path: Path) -> tuple[list[bytes], list[int], int]:
    """The file's readable lines, the (1-based) numbers of the unreadable ones before the
    last, and how many lines were dropped on the way: empty ones, and an unreadable last one
    (the line a crash cut short)."""
    pieces = path.read_bytes().split(b"\n")
    if pieces[-1] == b"":
        pieces.pop()  # what follows the newline that ends the last line
    lines = [(n, line, _readable(line)) for n, line in enumerate(pieces, 1) if line.strip()]
    dropped = len(pieces) - len(lines)
    if lines and not lines[-1][2]:
        lines.pop()
        dropped += 1
    bad = [n for n, _, readable in lines if not readable]
    return [line for _, line, readable in lines if readable], bad, dropped


def _readable(line: bytes) -> bool:
    """Whether TVM's JSON reader can read ``line``: JSON, without the NaN and Infinity that
    Python's reader would take and TVM's would not."""
    try:
        value = json.loads(line, parse_constant=_refuse)
    except ValueError:
        return False
    return isinstance(value, list) and len(value) == 2


def _refuse(name: str) -> None:
    raise ValueError(name)


def _names_workload(line: bytes, workloads: int | None) -> bool:
    """Whether the record names a workload line of the file (any, when it is missing)."""
    index = json.loads(line)[0]
    if not isinstance(index, int) or index < 0:
        return False
    return workloads is None or index < workloads


def _rewrite(path: Path, lines: list[bytes], dropped: int) -> int:
    """Write ``lines`` over ``path`` if that changes it (atomically); returns ``dropped``."""
    content = b"".join(line + b"\n" for line in lines)
    if content == path.read_bytes():
        return dropped
    tmp = path.with_name(path.name + ".repair")
    with open(tmp, "wb") as f:
        f.write(content)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return dropped
