"""The faults operators hit, with real processes: crashes, signals, torn databases, lost
devices, registry outages and tampered artifacts.

Crash safety: a tuning run stopped by SIGINT or SIGTERM, or killed with -9, keeps every record
it wrote, leaves no process behind, and ``--resume`` finishes it without measuring anything
twice; a database line cut short by a crash is repaired on resume.

Lost devices: a server that dies mid-round costs the candidates it was measuring (errors in the
database, never latencies) and the run goes on with the servers that remain; with none left, or
the tracker gone, the run waits ``server_wait_sec`` and stops in one resumable error; a dataset
collection likewise, without charging its workloads the failures.

Registry faults and integrity: one tune whose MLflow server (on 127.0.0.1) is stopped while it
tunes, so its registration fails; the run directory it leaves serves the registry tests.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from tvm import rpc
from tvm.rpc.tracker import Tracker as TvmTracker
from tvm.s_tir import meta_schedule as ms

from gradtune.database_repair import repair_database
from gradtune.errors import GradtuneError
from gradtune.measure.rpc_fleet import LocalFleet, Tracker, check_fleet_host, free_port
from gradtune.measure.rpc_session import (
    BoundedSession,
    DevicesLost,
    DeviceWatch,
    registered_servers,
)
from gradtune.measure.runner import MeasureSettings, make_rpc_runner
from gradtune.partition import partition
from gradtune.stop import StopSignal, defer_signals
from gradtune.tune import count_records, run_database, tune
from tests.conftest import EXAMPLES, ROOT, http_server, run_cli

WORKLOADS = "database_workload.json"
RECORDS = "database_tuning_record.json"


# --------------------------------------------------------------------------- torn databases


@pytest.fixture(scope="module")
def tvm_database(tmp_path_factory) -> Path:
    """A JSONDatabase written by TVM itself: two workloads, three records each."""
    import tvm
    from tvm import s_tir, te
    from tvm.s_tir import meta_schedule as ms

    work_dir = tmp_path_factory.mktemp("database")
    database = ms.database.JSONDatabase(
        path_workload=str(work_dir / WORKLOADS),
        path_tuning_record=str(work_dir / RECORDS),
        allow_missing=True,
        module_equality="structural",
    )
    a = te.placeholder((8,), name="a")
    for op in (lambda i: a[i] + 1.0, lambda i: a[i] * 2.0):
        mod = tvm.IRModule({"main": te.create_prim_func([a, te.compute((8,), op, name="b")])})
        workload = database.commit_workload(mod)
        for k in range(3):
            record = ms.database.TuningRecord(
                s_tir.Schedule(mod).trace, workload, [1e-6 * (k + 1)], tvm.target.Target("llvm")
            )
            database.commit_tuning_record(record)
    return work_dir


@pytest.fixture
def database(tvm_database, tmp_path) -> Path:
    for name in (WORKLOADS, RECORDS):
        (tmp_path / name).write_bytes((tvm_database / name).read_bytes())
    return tmp_path


def _tvm_reads(work_dir: Path) -> int:
    """How many records plain TVM reads from the database (it raises on an unreadable one)."""
    from tvm.s_tir import meta_schedule as ms

    database = ms.database.JSONDatabase(
        path_workload=str(work_dir / WORKLOADS),
        path_tuning_record=str(work_dir / RECORDS),
        allow_missing=False,
        module_equality="structural",
    )
    return len(database)


def _repair(work_dir: Path) -> dict[str, int]:
    repaired = repair_database(work_dir / WORKLOADS, work_dir / RECORDS)
    return {path.name: count for path, count in repaired.items()}


def test_intact_database_is_left_alone(database, caplog):
    before = {name: (database / name).read_bytes() for name in (WORKLOADS, RECORDS)}
    with caplog.at_level(logging.WARNING):
        assert _repair(database) == {}
    assert {name: (database / name).read_bytes() for name in before} == before
    assert not caplog.records
    assert _repair(database.parent / "nothing-here") == {}  # a new run: no files yet


def test_torn_last_record_is_dropped_with_a_count(database, caplog):
    path = database / RECORDS
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])  # cut mid-write
    with caplog.at_level(logging.WARNING):
        assert _repair(database) == {RECORDS: 1}
    assert f"repaired 1 torn line(s) in {path}" in caplog.text
    assert path.read_bytes() == b"".join(lines[:-1])
    assert _tvm_reads(database) == 5


def test_torn_last_workload_is_dropped_with_a_count(database, caplog):
    path = database / WORKLOADS
    whole = path.read_bytes()
    path.write_bytes(whole + whole[:1000])  # a third workload, cut before its records
    with caplog.at_level(logging.WARNING):
        assert _repair(database) == {WORKLOADS: 1}
    assert f"repaired 1 torn line(s) in {path}" in caplog.text
    assert path.read_bytes() == whole
    assert _tvm_reads(database) == 6


def test_whole_last_line_gets_its_newline_back(database):
    """A cut just before the newline: nothing to drop, but TVM's next append would glue its
    line onto this one."""
    path = database / RECORDS
    path.write_bytes(path.read_bytes()[:-1])
    assert _repair(database) == {}
    assert path.read_bytes().endswith(b"]\n")
    assert _tvm_reads(database) == 6


def test_lines_tvm_cannot_read_are_dropped_from_the_records(database):
    """An empty line (TVM crashes on it), an infinite latency (TVM writes ``inf`` and cannot
    read it back), and a record of a workload the workload file does not hold."""
    path = database / RECORDS
    lines = path.read_bytes().splitlines(keepends=True)
    inf = lines[0].replace(b"[1e-06]", b"[inf]").replace(b"[9.9999999999999995475e-07]", b"[inf]")
    assert inf != lines[0]
    orphan = b"[7" + lines[0][2:]
    path.write_bytes(lines[0] + b"\n" + inf + b"".join(lines[1:]) + orphan)
    assert _repair(database) == {RECORDS: 3}
    assert path.read_bytes() == b"".join(lines)
    assert _tvm_reads(database) == 6


def test_an_unreadable_workload_above_the_last_is_refused_by_name(database):
    """Records name their workload by line number: dropping one above the last would move
    every later record onto the wrong workload."""
    path = database / WORKLOADS
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0][:500] + b"\n" + lines[1])
    with pytest.raises(GradtuneError, match=f"{path}:1 is not a readable workload"):
        _repair(database)


def test_run_database_repairs_before_opening(database):
    from gradtune.tune import count_records, run_database

    path = database / RECORDS
    path.write_bytes(path.read_bytes()[:-20])
    assert count_records(run_database(database)) == 5


# --------------------------------------------------------------------------- signals, lifelines

# A process whose main thread is stuck where no signal reaches, as TVM's C++ scheduler waiting
# on a lost device: the signals are blocked in that thread while it sleeps in C.
STUCK = textwrap.dedent("""
    import ctypes, signal, sys, time
    from gradtune.stop import StopSignal, defer_signals, exit_on_signals

    def stuck(seconds):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        ctypes.CDLL(None).sleep(seconds)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})

    def ready():
        print("ready", flush=True)

    stop = StopSignal()
    with exit_on_signals(grace=2.0):
        if sys.argv[1] == "stuck":
            ready()
            stuck(60)
        elif sys.argv[1] == "stuck-stopping":
            with defer_signals(stop):
                ready()
                stuck(60)
        else:  # work that polls its stop signal
            with defer_signals(stop):
                ready()
                while not stop.stopped:
                    time.sleep(0.05)
                print("stopped at a boundary", flush=True)
    print("went on", flush=True)
""")


def _start_python(code: str, *args: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert proc.stdout.readline().strip() == "ready"
    return proc


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
@pytest.mark.parametrize(
    "mode, seconds",
    [("stuck", (0, 1)), ("stuck-stopping", (2, 3.5)), ("polling", (0, 1))],
    ids=["stuck", "stuck-stopping", "polling"],
)
def test_a_signal_ends_the_process_in_time_wherever_it_is(mode, seconds, sig):
    """Stuck outside work that can stop: at once. Stuck inside it: when its grace runs out.
    Work that stops at its boundary: there, and the signal is then raised in Python."""
    proc = _start_python(STUCK, mode)
    start = time.monotonic()
    proc.send_signal(sig)
    output, _ = proc.communicate(timeout=30)
    took = time.monotonic() - start
    assert seconds[0] <= took < seconds[1], (took, output)
    assert "went on" not in output
    if mode == "polling":
        assert "stopped at a boundary" in output
        # Python ends on an uncaught KeyboardInterrupt by killing itself with SIGINT.
        assert proc.returncode == (-sig if sig == signal.SIGINT else 128 + sig), output
    else:
        assert proc.returncode == 128 + sig, output
        assert f"{sig.name}: stopping" in output


def test_defer_signals_hands_the_signal_on_once_the_work_is_out():
    before = signal.getsignal(signal.SIGINT)
    stop = StopSignal()
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with defer_signals(stop):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)  # the handler runs here: it must not raise
            reached.append(stop.stopped)
    assert reached == [True]
    assert signal.getsignal(signal.SIGINT) is before


OWNER = textwrap.dedent("""
    import os, subprocess, sys, time
    member = subprocess.Popen(
        [sys.executable, "-m", "gradtune.lifeline", str(os.getpid()), "--remove", sys.argv[1],
         "http.server", "0", "--bind", "127.0.0.1"],
        start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    print("ready", flush=True)
    print(member.pid, flush=True)
    time.sleep(600)
""")


def test_a_helper_process_dies_with_its_owner_killed_with_9(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    owner = _start_python(OWNER, str(logs))
    member = psutil.Process(int(owner.stdout.readline()))
    time.sleep(1)
    assert member.is_running() and os.getpgid(member.pid) != os.getpgid(owner.pid)
    owner.kill()
    owner.wait()
    assert _gone([member], within=5), "the helper outlived its owner"
    assert not logs.exists()


POOL_OWNER = textwrap.dedent("""
    import os, sys, time
    from tvm.support.popen_pool import PopenPoolExecutor
    from gradtune.measure.builder import worker_lifeline

    def build(started):  # one that takes long
        with open(started, "w") as f:
            f.write(str(os.getpid()))
        time.sleep(600)

    pool = PopenPoolExecutor(max_workers=1, initializer=worker_lifeline())
    pool.submit(build, sys.argv[1])
    while not os.path.exists(sys.argv[1]) or not open(sys.argv[1]).read():
        time.sleep(0.1)
    print("ready", flush=True)
    time.sleep(600)
""")


def test_a_busy_build_worker_dies_with_its_owner_killed_with_9(tmp_path):
    """A worker reads its next job from a pipe and would see its owner gone only after the
    build in hand, up to the build timeout later."""
    started = tmp_path / "started"
    owner = _start_python(POOL_OWNER, str(started))
    worker = psutil.Process(int(started.read_text()))
    owner.kill()
    owner.wait()
    assert _gone([worker], within=5), "the build worker outlived its owner"


def _gone(procs: list[psutil.Process], within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not [p for p in procs if _alive(p)]:
            return True
        time.sleep(0.1)
    return False


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# --------------------------------------------------------------------------- real tuning runs

FLEET_MEMBER = "gradtune.measure.fleet_member"  # the module a fleet's tracker and servers run
# Two tasks: their defaults, then batches of 2. A run stopped after its defaults resumes with
# two batches left, so the resumed run can be stopped again mid-search.
TRIALS = 6


class TuneRun:
    """``gradtune tune`` of the tiny MLP in a process started as from a terminal (the leader of
    its own process group), every process it starts marked in its environment."""

    def __init__(self, out: Path, *extra: str) -> None:
        self.out = out
        self.mark = uuid.uuid4().hex
        self.log = out.parent / f"{out.name}-{len(list(out.parent.glob('*.log')))}.log"
        self.argv = ["tune", str(EXAMPLES / "small_cnn.py"), "--entry", "tiny_mlp",
                     "--trials", str(TRIALS), "--out", str(out), *extra]  # fmt: skip
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gradtune.cli", *self.argv], cwd=ROOT,
                env={**os.environ, "GRADTUNE_TEST_RUN": self.mark}, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for_records(self, count: int, timeout: float = 600) -> list[str]:
        deadline = time.monotonic() + timeout
        while len(_records(self.out)) < count:
            assert self.proc.poll() is None, self.output()[-3000:]
            assert time.monotonic() < deadline, f"no {count} records within {timeout} s"
            time.sleep(0.25)
        return _records(self.out)

    def processes(self) -> list[psutil.Process]:
        """The live processes this run started (the CLI itself included)."""
        found = []
        for proc in psutil.process_iter():
            try:
                if proc.environ().get("GRADTUNE_TEST_RUN") == self.mark and _alive(proc):
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return found

    def fleet(self) -> list[psutil.Process]:
        fleet = [p for p in self.processes() if FLEET_MEMBER in p.cmdline()]
        assert any("tracker" in p.cmdline() for p in fleet), "no RPC fleet"
        return fleet


def _records(out: Path) -> list[str]:
    path = out / RECORDS
    return path.read_text().splitlines() if path.exists() else []


def _whole(lines: list[str]) -> list[str]:
    """The records among ``lines`` (a kill -9 may have cut the last one short)."""
    whole = []
    for line in lines:
        try:
            json.loads(line)
        except ValueError:
            continue
        whole.append(line)
    return whole


def _log_dirs(fleet: list[psutil.Process]) -> set[str]:
    """The fleet's log directories (``gradtune.lifeline --remove DIR``)."""
    dirs = set()
    for proc in fleet:
        argv = proc.cmdline()
        if "--remove" in argv:
            dirs.add(argv[argv.index("--remove") + 1])
    assert dirs
    return dirs


def _resume_and_check(run: TuneRun, kept: list[str]) -> str:
    """``--resume`` finishes the run: the kept records first, nothing measured twice."""
    resumed = run_cli(*run.argv, "--resume", timeout=600)
    output = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, output[-3000:]
    after = _records(run.out)
    assert after[: len(kept)] == kept, "records from before the stop were kept, in order"
    # A program is its workload and trace: every task's default schedule has the same trace.
    programs = [json.dumps([json.loads(line)[0], json.loads(line)[1][0]]) for line in after]
    assert len(set(programs)) == len(programs), "a kept measurement was measured again"
    summary = json.loads((run.out / "summary.json").read_text())
    assert summary["resumed_trials"] == len(kept)
    assert summary["total_trials"] == len(after) >= TRIALS
    return output


@pytest.mark.slow
def test_sigterm_then_kill_9_stop_a_tune_that_resume_finishes(tmp_path):
    """One run stopped twice, each stop's resume the next stage (a tune less per check).

    SIGTERM, as ``timeout`` or CI sends it, while the RPC server hangs (its workers frozen:
    the C++ scheduler waits on a device that will never answer): the run stops within 10 s
    with one line, and nothing it started is left. SIGINT, as a terminal's Ctrl-C sends it to
    the process group while the server measures, is the same checks in ``test_e2e``.

    Resumed, it is killed -9 mid-search: every process it started dies with it, their logs
    go, and no measured record is lost. A kill -9 can land in the middle of an append to
    either file of the database: both are torn here, and the last resume repairs them and
    finishes the run."""
    run = TuneRun(tmp_path / "out")
    run.wait_for_records(2)
    fleet = run.fleet()
    everything = run.processes()
    logs = _log_dirs(fleet)
    for proc in fleet:
        if "server" in proc.cmdline():
            for worker in proc.children(recursive=True):
                worker.suspend()
    start = time.monotonic()
    sig = signal.SIGTERM
    run.proc.send_signal(sig)
    run.proc.wait(timeout=60)
    took = time.monotonic() - start
    output = run.output()
    assert took < 10, f"stopped after {took:.1f} s"
    assert run.proc.returncode == 128 + sig, output[-3000:]
    message = (
        f"gradtune: stopped by {sig.name}; rerun the same command with --resume to continue "
        "(measured records are kept)"
    )
    assert output.strip().splitlines()[-1] == message, output[-3000:]
    assert output.count("gradtune: stopped") == 1
    assert "Traceback" not in output, output[-3000:]
    assert _gone(everything, within=10), [p.cmdline() for p in everything if _alive(p)]
    assert not [d for d in logs if os.path.exists(d)], "RPC log directories left behind"
    stopped = _whole(_records(run.out))
    assert len(stopped) <= TRIALS - 4, "two batches are left for the resumed run"

    run = TuneRun(run.out, "--resume")
    run.wait_for_records(len(stopped) + 1)  # its first batch: the second is under way
    fleet = run.fleet()
    everything = run.processes()
    logs = _log_dirs(fleet)
    run.proc.kill()
    run.proc.wait()
    assert _gone(everything, within=10), [p.cmdline() for p in everything if _alive(p)]
    assert not [d for d in logs if os.path.exists(d)], "RPC log directories left behind"

    records, workloads = run.out / RECORDS, run.out / WORKLOADS
    kept = _whole(_records(run.out))[:-1]
    torn = _whole(_records(run.out))[-1]
    assert kept[: len(stopped)] == stopped, "the resume kept what SIGTERM left"
    records.write_text("".join(line + "\n" for line in kept) + torn[: len(torn) // 2])
    first_workload = workloads.read_text().splitlines()[0]
    with open(workloads, "a") as f:
        f.write(first_workload[: len(first_workload) // 2])
    output = _resume_and_check(run, kept)
    assert f"repaired 1 torn line(s) in {records}" in output.replace("\n", "")
    assert f"repaired 1 torn line(s) in {workloads}" in output.replace("\n", "")
    assert _tvm_reads(run.out) == len(_records(run.out))


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
    """The fleet's server processes (the tracker is the first one started)."""
    return [psutil.Process(p.pid) for p in fleet._procs[1:]]


def session_worker(server: psutil.Process) -> psutil.Process | None:
    """The process serving a session right now: the server forks one per session."""
    for child in server.children():
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
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
    """(sessions opened, sessions finished) in a fleet server's log."""
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
        # Read while the fleet runs: its logs are removed with it.
        opened, finished = sessions_logged(fleet._procs[1].log_path)
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
        survivor_finished = sessions_logged(survivor_log)[1]  # its logs go with the fleet
    assert result.trials == 12
    records = run_secs_in_commit_order(tmp_path)
    assert len(records) == 12
    # The killed session's candidate at most; the others were measured on the survivor.
    assert sum(r == [FAILED] for r in records) <= 1
    assert survivor_finished >= 1


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
    settings = CollectSettings(
        random_per_workload=4, batch_size=4, builder_workers=1, server_wait_sec=3
    )
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
        " within 3 s; rerun the same command to resume"
    )
    assert state.failed == 0 and not state.first_error
    assert store.counts.get(info.key, 0) == 0


# ------------------------------------------------------------------ registry and integrity

NAME = "faults-mlp"


@contextlib.contextmanager
def mlflow_server(root: Path, port: int):
    """A real MLflow server whose store (sqlite + artifacts under ``root``) outlives it, so the
    same registry can be stopped and started again on the same port."""
    argv = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
            "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
            "--artifacts-destination", str(root / "artifacts"), "--workers", "1"]  # fmt: skip
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with http_server(argv, f"http://127.0.0.1:{port}/health", env):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def failed_registration(tmp_path_factory):
    """``gradtune tune`` whose MLflow server answers its pre-check, then stops mid-tune."""
    root = tmp_path_factory.mktemp("faults-registry")
    port, out = free_port(), root / "run"
    log_out, log_err = root / "tune.stdout", root / "tune.stderr"
    with mlflow_server(root / "store", port) as uri:
        argv = [sys.executable, "-m", "gradtune.cli", "tune", str(EXAMPLES / "small_cnn.py"),
                "--entry", "tiny_mlp", "--trials", "2", "--out", str(out), "--name", NAME,
                "--mlflow-uri", uri]  # fmt: skip
        with open(log_out, "w") as stdout, open(log_err, "w") as stderr:
            proc = subprocess.Popen(argv, cwd=ROOT, stdout=stdout, stderr=stderr, text=True)
        records = out / "database_tuning_record.json"
        deadline = time.monotonic() + 400
        # After the first measured record: the tune has looked up its cost model in this
        # registry by then, and compiling is still to come before registration.
        while proc.poll() is None and time.monotonic() < deadline:
            if records.exists() and records.stat().st_size > 0:
                break
            time.sleep(0.2)
        assert proc.poll() is None, f"the tune ended early:\n{log_err.read_text()[-3000:]}"
    start = time.monotonic()
    proc.wait(timeout=400)
    return SimpleNamespace(
        root=root, store=root / "store", port=port, uri=uri, out=out,
        returncode=proc.returncode, stdout=log_out.read_text(), stderr=log_err.read_text(),
        seconds_after_stop=time.monotonic() - start,
    )  # fmt: skip


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("gradtune: error:")]


@pytest.mark.slow
def test_mlflow_down_at_registration_is_retried_then_registered_later(
    failed_registration, tmp_path
):
    run = failed_registration
    output = run.stdout + run.stderr
    assert run.returncode == 3, output[-3000:]
    (line,) = _error_lines(run.stderr)
    assert f"could not register the model in MLflow at {run.uri}" in line
    assert f"kept in {run.out}" in line
    # Declared on the Prefect task: three retries after about 4, 8 and 16 s, then the line.
    delays = re.findall(r"Retry (\d)/3 will start ([\d.]+) second", output)
    assert [int(attempt) for attempt, _ in delays] == [1, 2, 3], output[-3000:]
    for attempt, delay in delays:
        assert 0.8 <= float(delay) / (4 * 2 ** (int(attempt) - 1)) <= 1.2, delays
    assert run.seconds_after_stop > sum(float(delay) for _, delay in delays)
    for name in ("model.so", "database_tuning_record.json", "database_workload.json"):
        assert (run.out / name).stat().st_size > 0, name
    assert not (run.out / "summary.json").exists()

    command = line.split("register them later with: ", 1)[1]
    assert command == f"gradtune register {run.out} --mlflow-uri {run.uri}"
    with mlflow_server(run.store, run.port):
        import mlflow

        client = mlflow.MlflowClient(run.uri)
        assert client.search_model_versions(f"name = '{NAME}'") == [], "a version was left"
        registered = run_cli(*shlex.split(command)[1:], timeout=300)
        assert registered.returncode == 0, registered.stdout + registered.stderr
        assert f"registered {NAME}@champion" in registered.stdout.replace("\n", " ")
        summary = json.loads((run.out / "summary.json").read_text())
        assert summary["registered"] == f"{NAME}@champion" and summary["mlflow_uri"] == run.uri
        (version,) = client.search_model_versions(f"name = '{NAME}'")
        assert version.version == summary["model_version"]

        pulled = run_cli("pull", f"{NAME}@champion", "--out", str(tmp_path / "pulled"),
                         "--mlflow-uri", run.uri, timeout=300)  # fmt: skip
        assert pulled.returncode == 0, pulled.stderr
        info = json.loads(pulled.stdout)
        assert info["verified"] and info["output_shapes"] == [[4, 16]] and info["finite"]


def _register_in_sqlite(run_dir: Path, store: Path) -> str:
    store.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{store / 'mlflow.db'}"
    registered = run_cli("register", str(run_dir), "--mlflow-uri", uri, timeout=300)
    assert registered.returncode == 0, registered.stdout + registered.stderr
    return uri


@pytest.mark.slow
def test_tampered_model_so_is_refused_before_its_code_runs(failed_registration, tmp_path):
    if shutil.which("cc") is None:
        pytest.skip("no C compiler: cannot build a library whose constructor leaves a marker")
    marker = tmp_path / "constructor-ran"
    source = tmp_path / "ctor.c"
    source.write_text(
        "#include <stdio.h>\n"
        "__attribute__((constructor)) static void ran(void) {\n"
        f'  FILE *f = fopen("{marker}", "w"); if (f) fclose(f);\n'
        "}\n"
    )
    library = tmp_path / "ctor.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    # The marker proves a load: loading the library once leaves it.
    subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(library)!r})"],
                   check=True)  # fmt: skip
    assert marker.exists()
    marker.unlink()

    uri = _register_in_sqlite(failed_registration.out, tmp_path / "store")
    (stored,) = (tmp_path / "store" / "mlartifacts").rglob("artifacts/model.so")
    shutil.copyfile(library, stored)

    for extra in ([], ["--allow-unverified"]):  # which only admits versions without checksums
        pulled = run_cli("pull", f"{NAME}@champion", "--out", str(tmp_path / "pulled"),
                         "--mlflow-uri", uri, *extra, timeout=300)  # fmt: skip
        assert pulled.returncode != 0
        assert "Traceback" not in pulled.stderr
        (line,) = _error_lines(pulled.stderr)
        assert line.startswith(
            f"gradtune: error: model.so of {NAME}@champion does not match its registered SHA-256"
        ), line
        assert not marker.exists(), "pull ran the tampered library's code"
    assert not (tmp_path / "pulled" / "artifacts" / "model.so").exists()

    # Plain MLflow: the pyfunc's load_context checks before it loads the library.
    code = (
        "import mlflow;"
        f"mlflow.set_tracking_uri({uri!r});"
        f"mlflow.pyfunc.load_model('models:/{NAME}@champion')"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300, cwd=tmp_path)  # fmt: skip
    assert loaded.returncode != 0
    assert "model.so does not match its registered SHA-256" in loaded.stderr, loaded.stderr
    assert not marker.exists(), "load_context ran the tampered library's code"


@pytest.mark.slow
def test_version_without_checksums_is_refused_unless_allowed(failed_registration, tmp_path):
    import mlflow

    uri = _register_in_sqlite(failed_registration.out, tmp_path / "store")
    client = mlflow.MlflowClient(uri)
    version = client.get_model_version_by_alias(NAME, "champion")
    for key in version.tags:  # as registered before checksums existed
        if key.startswith("sha256/"):
            client.delete_model_version_tag(NAME, version.version, key)

    args = ["pull", f"{NAME}@champion", "--out", str(tmp_path / "pulled"), "--mlflow-uri", uri]
    refused = run_cli(*args, timeout=300)
    assert refused.returncode != 0
    (line,) = _error_lines(refused.stderr)
    assert "registered without SHA-256 checksums" in line and "--allow-unverified" in line
    assert not (tmp_path / "pulled").exists()

    allowed = run_cli(*args, "--allow-unverified", timeout=300)
    assert allowed.returncode == 0, allowed.stderr
    info = json.loads(allowed.stdout)
    assert not info["verified"] and info["output_shapes"] == [[4, 16]]


def test_fleet_refuses_to_listen_beyond_loopback():
    fleet = LocalFleet(host="0.0.0.0")
    with pytest.raises(GradtuneError, match="refusing to start RPC servers on 0.0.0.0"):
        with fleet:
            pass
    assert fleet._procs == [], "no process was started"
    for host in ("127.0.0.1", "::1", "localhost"):
        check_fleet_host(host, allow_network=False)
    check_fleet_host("0.0.0.0", allow_network=True)
