"""Lost devices: an RPC server or the tracker dies during a tune, with real processes.

A server that dies mid-round costs the candidates it was measuring (errors in the database,
never latencies) and the run goes on with the servers that remain; with none left, or the
tracker gone, the run waits ``server_wait_sec`` and stops in one resumable error; a dataset
collection likewise, without charging its workloads the failures. The fast tests check the
bounded wait itself against a real tracker started in this process.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import psutil
import pytest
from tvm import rpc
from tvm.rpc.tracker import Tracker as TvmTracker
from tvm.s_tir import meta_schedule as ms

from gradtune.errors import GradtuneError
from gradtune.measure.rpc_fleet import LocalFleet, Tracker
from gradtune.measure.rpc_session import (
    BoundedSession,
    DevicesLost,
    DeviceWatch,
    registered_servers,
)
from gradtune.measure.runner import MeasureSettings, make_rpc_runner
from gradtune.partition import partition
from gradtune.stop import StopSignal
from gradtune.tune import count_records, run_database, tune

FAILED = 1e10  # MetaSchedule's run_secs for a candidate that failed to build or run


# ------------------------------------------------------------------ the bounded wait (fast)


@pytest.fixture
def tvm_tracker():
    tracker = TvmTracker("127.0.0.1", port=9190, port_end=9990, silent=True)
    yield tracker
    tracker.terminate()


def rpc_config(port: int, key: str = "dev") -> ms.runner.RPCConfig:
    return ms.runner.RPCConfig(
        tracker_host="127.0.0.1", tracker_port=port, tracker_key=key, session_timeout_sec=10
    )


def test_no_server_gives_up_after_the_wait_then_at_once(tvm_tracker):
    open_session = BoundedSession(wait_sec=2, poll_sec=0.2)
    start = time.monotonic()
    with pytest.raises(DevicesLost) as lost:
        open_session(rpc_config(tvm_tracker.port))
    assert 2 <= time.monotonic() - start < 8
    assert str(lost.value) == (
        f"no RPC server for key dev registered with tracker 127.0.0.1:{tvm_tracker.port} within 2 s"
    )
    # The rest of the batch does not wait again, nor does a copy (the runner pickles one per
    # candidate); another runner's factory does.
    start = time.monotonic()
    with pytest.raises(DevicesLost):
        BoundedSession(2, 0.2, token=open_session.token)(rpc_config(tvm_tracker.port))
    assert time.monotonic() - start < 1
    start = time.monotonic()
    with pytest.raises(DevicesLost):
        BoundedSession(wait_sec=1, poll_sec=0.2)(rpc_config(tvm_tracker.port))
    assert time.monotonic() - start >= 1


def test_tracker_gone_gives_up_after_the_wait(tvm_tracker):
    port = tvm_tracker.port
    tvm_tracker.terminate()
    start = time.monotonic()
    with pytest.raises(DevicesLost, match=f"^RPC tracker 127.0.0.1:{port} unreachable for 1 s$"):
        BoundedSession(wait_sec=1, poll_sec=0.2)(rpc_config(port))
    assert time.monotonic() - start < 6


def test_a_server_registering_during_the_wait_is_used(tvm_tracker):
    server = None

    def register_later():
        nonlocal server
        time.sleep(1.5)
        server = rpc.Server(
            "127.0.0.1", port=9000, port_end=9990, key="dev",
            tracker_addr=("127.0.0.1", tvm_tracker.port), silent=True,
        )  # fmt: skip

    thread = threading.Thread(target=register_later)
    thread.start()
    try:
        session = BoundedSession(wait_sec=60, poll_sec=0.2)(rpc_config(tvm_tracker.port))
        assert session.cpu(0).exist
    finally:
        thread.join()
        if server is not None:
            server.terminate()


def test_a_lost_device_stops_the_run_from_the_runners_worker(tvm_tracker):
    """The real chain: the runner's worker process gives up, its candidate fails with the
    reason inside the error text, and the watch turns that into the run's stop and one line."""
    tracker = Tracker("127.0.0.1", tvm_tracker.port, "dev")
    runner = make_rpc_runner(tracker, MeasureSettings(server_wait_sec=2))
    try:
        # Opening the session comes first, so the artifact is never read.
        inputs = [ms.runner.RunnerInput("/nonexistent.so", "cpu", []) for _ in range(4)]
        start = time.monotonic()
        results = [future.result() for future in runner.run(inputs)]
        took = time.monotonic() - start
        assert 2 <= took < 5, took  # one wait for the batch, not one per candidate
    finally:
        runner.pool.shutdown()
    assert all(r.run_secs is None and "DevicesLost" in r.error_msg for r in results)
    stop = StopSignal()
    watch = DeviceWatch(stop)
    watch.note(results)
    assert stop.stopped
    with pytest.raises(GradtuneError) as err:
        watch.raise_if_lost()
    assert str(err.value) == (
        f"no RPC server for key dev registered with tracker 127.0.0.1:{tvm_tracker.port}"
        " within 2 s; the run is resumable with --resume"
    )


def test_failures_that_are_not_lost_devices_do_not_stop_the_run():
    stop = StopSignal()
    watch = DeviceWatch(stop)
    failed = ms.runner.RunnerResult(None, "RPCRunner: An exception occurred\nConnection reset")
    watch.note([failed, ms.runner.RunnerResult([1e-5], None)])
    assert not stop.stopped
    watch.raise_if_lost()


# ------------------------------------------------------------- a tune losing its devices (slow)

WAIT = MeasureSettings(server_wait_sec=5)


def server_procs(fleet: LocalFleet) -> list[psutil.Process]:
    """The fleet's ``rpc_server`` processes (the tracker is the first one started)."""
    return [psutil.Process(p.pid) for p in fleet._procs[1:]]


def session_worker(server: psutil.Process) -> psutil.Process | None:
    """The process serving a session right now: the server forks one per session, below its
    listening worker."""
    for child in server.children(recursive=True):
        try:
            if child.parent().pid != server.pid and child.status() != psutil.STATUS_ZOMBIE:
                return child
        except psutil.NoSuchProcess:
            continue
    return None


def kill_mid_session(fleet: LocalFleet, armed: threading.Event, whole_group: bool, out: dict):
    """Once ``armed``, wait for a server to be inside a session and SIGKILL it: the whole
    server (its process group) or only the session worker."""

    def watch():
        armed.wait()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for server in server_procs(fleet):
                worker = session_worker(server)
                if worker is None:
                    continue
                try:
                    if whole_group:
                        os.killpg(server.pid, signal.SIGKILL)
                    else:
                        worker.kill()
                except (ProcessLookupError, psutil.NoSuchProcess):
                    continue
                out.update(server=server, at=time.monotonic())
                return
            time.sleep(0.005)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def run_secs_in_commit_order(work_dir) -> list[list[float]]:
    lines = (work_dir / "database_tuning_record.json").read_text().splitlines()
    return [json.loads(line)[1][1] for line in lines if line.strip()]


def sessions_logged(server_log: str) -> tuple[int, int]:
    """(sessions opened, sessions finished) in an ``rpc_server`` log."""
    text = open(server_log, errors="replace").read()
    return text.count("connected from"), text.count("finish serving")


@pytest.mark.slow
def test_server_killed_mid_round_stops_resumable_and_resumes(tiny_model, llvm_target, tmp_path):
    _, tasks = partition(tiny_model.mod, tiny_model.params, llvm_target)
    armed, killed = threading.Event(), {}
    fleet = LocalFleet()
    with fleet as tracker:
        watcher = kill_mid_session(fleet, armed, whole_group=True, out=killed)
        with pytest.raises(GradtuneError) as err:
            tune(tasks, llvm_target, tmp_path, tracker, max_trials=16, trials_per_round=4,
                 measure=WAIT, on_round=lambda record: armed.set())  # fmt: skip
        ended = time.monotonic()
        watcher.join(timeout=1)
        server_log = fleet._procs[1].log_path
    assert killed, "the server was never caught inside a session"
    assert str(err.value) == (
        f"no RPC server for key {tracker.key} registered with tracker "
        f"{tracker.host}:{tracker.port} within 5 s; the run is resumable with --resume"
    )
    # Stopped within the wait, the rest of the batch failing at once, and MetaSchedule's
    # wind-down; not hung.
    assert ended - killed["at"] < 45

    records = run_secs_in_commit_order(tmp_path)
    valid = [r for r in records if r != [FAILED]]
    assert len(records) > len(valid) >= 1
    assert all(0 < s < 1 for r in valid for s in r)
    # Only candidates the server actually measured carry latencies: every valid record is a
    # session it opened, and every session it finished is a valid record.
    opened, finished = sessions_logged(server_log)
    assert finished <= len(valid) <= opened
    assert count_records(run_database(tmp_path)) == len(records)

    # A new fleet resumes the run to its budget, the first records untouched.
    with LocalFleet() as tracker:
        result = tune(tasks, llvm_target, tmp_path, tracker, max_trials=16, trials_per_round=4,
                      measure=WAIT)  # fmt: skip
    assert result.resumed_trials == len(records)
    assert count_records(run_database(tmp_path)) == 16
    assert run_secs_in_commit_order(tmp_path)[: len(records)] == records


@pytest.mark.slow
def test_one_of_two_servers_killed_the_run_finishes_on_the_other(tiny_model, llvm_target, tmp_path):
    _, tasks = partition(tiny_model.mod, tiny_model.params, llvm_target)
    armed, killed = threading.Event(), {}
    fleet = LocalFleet(num_servers=2)
    with fleet as tracker:
        # Only the forked session worker, as when a kernel crashes the measurement: the server
        # then drops out of the tracker.
        watcher = kill_mid_session(fleet, armed, whole_group=False, out=killed)
        result = tune(tasks, llvm_target, tmp_path, tracker, max_trials=12, trials_per_round=4,
                      measure=WAIT, on_round=lambda record: armed.set())  # fmt: skip
        watcher.join(timeout=1)
        assert killed, "no server was caught inside a session"
        # The killed server left the tracker; everything after it ran on the survivor.
        assert registered_servers((tracker.host, tracker.port), tracker.key) == 1
        survivor = next(p for p in server_procs(fleet) if p.pid != killed["server"].pid)
        survivor_log = next(p.log_path for p in fleet._procs if p.pid == survivor.pid)
    assert result.trials == 12
    records = run_secs_in_commit_order(tmp_path)
    assert len(records) == 12
    # The killed session's candidate at most; the others were measured on the survivor.
    assert sum(r == [FAILED] for r in records) <= 1
    assert sessions_logged(survivor_log)[1] >= 1


@pytest.mark.slow
def test_tracker_killed_mid_run_stops_resumable(tiny_model, llvm_target, tmp_path):
    _, tasks = partition(tiny_model.mod, tiny_model.params, llvm_target)
    fleet = LocalFleet()
    killed = {}

    def kill_tracker(record):
        if not killed:
            os.killpg(fleet._procs[0].pid, signal.SIGKILL)
            killed["at"] = time.monotonic()

    with fleet as tracker, pytest.raises(GradtuneError) as err:
        tune(tasks, llvm_target, tmp_path, tracker, max_trials=400, trials_per_round=4,
             measure=WAIT, on_round=kill_tracker)  # fmt: skip
    assert time.monotonic() - killed["at"] < 45
    assert str(err.value) == (
        f"RPC tracker {tracker.host}:{tracker.port} unreachable for 5 s;"
        " the run is resumable with --resume"
    )
    assert 4 <= count_records(run_database(tmp_path)) < 400


@pytest.mark.slow
def test_collection_with_no_server_stops_without_counting_failures(
    tiny_model, llvm_target, tvm_tracker, tmp_path, monkeypatch
):
    """A dataset collection measures through the same runner: with the devices gone it stops
    in one line, and the workload is not charged failures it did not cause (they persist in
    the manifest and would get it skipped)."""
    import tvm_ffi

    from gradtune.dataset.collect import Collector
    from gradtune.dataset.settings import CollectSettings
    from gradtune.dataset.store import DatasetStore
    from gradtune.dataset.workloads import WorkloadInfo, WorkloadProgress
    from gradtune.target import parse_target

    monkeypatch.setenv("GRADTUNE_CACHE", str(tmp_path / "cache"))
    _, tasks = partition(tiny_model.mod, tiny_model.params, llvm_target)
    task = tasks[0]
    info = WorkloadInfo(str(tvm_ffi.structural_hash(task.mod)), task.mod, task.kernel_class, 1.0)
    store = DatasetStore(tmp_path / "data", parse_target(None))
    settings = CollectSettings(random_per_workload=4, batch_size=4, builder_workers=1)
    tracker = Tracker("127.0.0.1", tvm_tracker.port, "dev")
    collector = Collector(store, llvm_target, tracker, settings)
    state = WorkloadProgress()
    try:
        with pytest.raises(GradtuneError) as err:
            collector.run_workload(info, "random", 4, state)
    finally:
        collector.close()
    assert str(err.value) == (
        f"no RPC server for key dev registered with tracker 127.0.0.1:{tvm_tracker.port}"
        " within 60 s; rerun the same command to resume"
    )
    assert state.failed == 0 and not state.first_error
    assert store.counts.get(info.key, 0) == 0
