import os
import re
import shutil
import subprocess
import sys
import time

import psutil
import pytest
from tvm import rpc

from gradtune import threads
from gradtune.errors import GradtuneError
from gradtune.measure.rpc_fleet import (
    LocalFleet,
    check_tracker,
    parse_tracker,
    query_free_servers,
    threads_mismatch,
)


def _children_alive(pids):
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def test_local_fleet_registers_and_stops_everything():
    fleet = LocalFleet(num_servers=2)
    with fleet as tracker:
        assert tracker.host == "127.0.0.1"
        assert query_free_servers(tracker) == 2
        check_tracker(tracker)  # a user-supplied tracker goes through the same check
        # Its servers run kernels on the threads this process chose (importing gradtune
        # chose this machine's physical cores, unless the environment named a count), not on
        # TVM's halved default.
        session = rpc.connect_tracker(tracker.host, tracker.port).request(tracker.key)
        assert session.get_function("runtime.NumThreads")() == threads.target_threads({})
        pids = [p.pid for p in fleet._procs]
        tree = [c.pid for pid in pids for c in psutil.Process(pid).children(recursive=True)]
    assert not _children_alive(pids + tree)


def test_a_server_on_another_thread_count_than_the_target_is_named(monkeypatch):
    """A remote device's server sizes its pool from its own environment: one started without
    TVM_NUM_THREADS on a 2-core device times candidates on one thread, and the run says so."""
    monkeypatch.setenv("TVM_NUM_THREADS", "1")  # the servers inherit it, as a remote one would
    with LocalFleet() as tracker:
        warning = threads_mismatch(tracker, {"kind": "llvm", "num-cores": 2})
        assert warning and "1 thread(s)" in warning and "TVM_NUM_THREADS=2" in warning
        assert threads_mismatch(tracker, {"kind": "llvm", "num-cores": 1}) is None
        assert threads_mismatch(tracker, {"kind": "cuda"}) is None  # not the CPU pool
        deadline = time.monotonic() + 10  # the session asked through is given back
        while query_free_servers(tracker) != 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert query_free_servers(tracker) == 1


def test_fleet_stops_on_error_inside():
    fleet = LocalFleet()
    with pytest.raises(RuntimeError, match="boom"):
        with fleet:
            pids = [p.pid for p in fleet._procs]
            raise RuntimeError("boom")
    assert not _children_alive(pids)


@pytest.mark.parametrize(
    "spec, key, message", [("nohost", "k", "not HOST:PORT"), ("h:1", None, "needs --key")]
)
def test_parse_tracker_errors(spec, key, message):
    with pytest.raises(GradtuneError, match=message):
        parse_tracker(spec, key)


def test_fleet_removes_its_logs_and_keeps_them_when_it_fails_to_start():
    fleet = LocalFleet()
    with fleet:
        logs = fleet._log_dir
        assert os.path.isdir(logs)
    assert not os.path.exists(logs)

    with pytest.raises(GradtuneError, match=r"did not start within 0 s \(logs in (\S+)\)") as err:
        with LocalFleet(startup_timeout=0.001):
            pass
    logs = re.search(r"logs in (\S+)\)", str(err.value))[1]
    assert os.path.isdir(logs)
    shutil.rmtree(logs)


OWNER = """
import sys, time
from gradtune.measure.rpc_fleet import LocalFleet
with LocalFleet() as tracker:
    print(tracker.port, flush=True)
    time.sleep(600)
"""


def test_fleet_dies_with_its_owner_killed_with_9():
    """Each member runs in a session of its own (a terminal's Ctrl-C must not reach it), so
    nothing passes the owner's death on: each member watches its owner itself."""
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True)
    port = owner.stdout.readline().strip()
    assert port, "the fleet did not start"
    members = psutil.Process(owner.pid).children(recursive=True)
    assert any(f"127.0.0.1:{port}" in " ".join(p.cmdline()) for p in members)  # a server
    logs = {
        p.cmdline()[p.cmdline().index("--remove") + 1] for p in members if "--remove" in p.cmdline()
    }
    owner.kill()
    owner.wait()
    deadline = time.monotonic() + 10
    while _children_alive([p.pid for p in members]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _children_alive([p.pid for p in members])
    assert logs and not any(os.path.exists(d) for d in logs)
