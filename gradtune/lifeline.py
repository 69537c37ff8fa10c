"""Helper processes that die with their owner, however the owner ends (kill -9 included).

gradtune starts processes that must not outlive the one that started them: the local RPC
fleet's tracker and servers (each with workers of its own), build workers, and under the CLI
the process that runs the tuning flow. Several are kept out of reach of their owner's signals
on purpose (the fleet runs in sessions of its own so that a terminal's Ctrl-C cannot kill a
server mid-measure), so nothing passes on a kill -9 of the owner, and no code of the owner runs
after one.

So each such process watches its owner itself. Linux's parent-death signal
(``PR_SET_PDEATHSIG``) is not enough: it reaches only the direct child, not the workers a
server forks, and it fires when the *thread* that started the child exits, not the process. A
pidfd on the owner, waited on by a daemon thread, sees the owner's process end within
milliseconds, however it ends. The thread then SIGKILLs what the watching process answers for:
its whole process group when it leads one (a fleet member and the workers it forked; the flow
process with its build workers and Prefect's temporary server), else only itself (a build
worker, which shares its owner's group). SIGKILL, because a server waiting on a device may be
in no state to handle anything gentler, and what it was measuring belongs to a dead run.
"""

from __future__ import annotations

import os
import runpy
import select
import shutil
import signal
import sys
import threading
import time

USAGE = "usage: python -m gradtune.lifeline OWNER_PID [--remove DIR] MODULE [ARG ...]"


def watch_owner(owner: int, remove: str | None = None) -> None:
    """From now on, when process ``owner`` (this process's parent) ends, remove the directory
    ``remove`` (when given) and SIGKILL this process, with its process group if it leads one."""

    def wait_and_kill() -> None:
        _wait_for_exit(owner)
        if remove:
            shutil.rmtree(remove, ignore_errors=True)
        if os.getpgrp() == os.getpid():
            os.killpg(os.getpid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=wait_and_kill, name="gradtune-lifeline", daemon=True).start()


def _wait_for_exit(owner: int) -> None:
    try:
        fd = os.pidfd_open(owner)
    except ProcessLookupError:
        return  # already gone
    except (AttributeError, OSError):  # no pidfd (Linux < 5.3): look twice a second instead
        while os.getppid() == owner:
            time.sleep(0.5)
        return
    try:
        # The pid is checked after the pidfd is open: had the owner already died and its pid
        # been reused, this process's parent would no longer be that pid.
        if os.getppid() != owner:
            return
        select.select([fd], [], [])  # readable once the owner has exited
    finally:
        os.close(fd)


def main(argv: list[str]) -> None:
    """Run ``MODULE`` as ``__main__`` with ``ARG ...`` as its arguments, watching ``OWNER``."""
    try:
        owner = int(argv[0])
        remove = None
        rest = argv[1:]
        if rest[:1] == ["--remove"]:
            remove, rest = rest[1], rest[2:]
        module, args = rest[0], rest[1:]
    except (IndexError, ValueError):
        sys.exit(USAGE)
    watch_owner(owner, remove)
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
