"""The faults operators hit, with real processes: crashes, signals, torn databases.

Crash safety: a tuning run stopped by SIGINT or SIGTERM, or killed with -9, keeps every record
it wrote, leaves no process behind, and ``--resume`` finishes it without measuring anything
twice; a database line cut short by a crash is repaired on resume.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import psutil
import pytest

from gradtune.database_repair import repair_database
from gradtune.errors import GradtuneError
from gradtune.stop import StopSignal, defer_signals
from tests.conftest import EXAMPLES, ROOT, run_cli

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

TRIALS = 4  # two tasks: a first batch of 2 each, the smallest run with something left to resume


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
        fleet = [p for p in self.processes() if "tvm.exec.rpc_" in " ".join(p.cmdline())]
        assert any("rpc_tracker" in " ".join(p.cmdline()) for p in fleet), "no RPC fleet"
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
    traces = [json.dumps(json.loads(line)[1][0]) for line in after]
    assert len(set(traces)) == len(traces), "a kept measurement was measured again"
    summary = json.loads((run.out / "summary.json").read_text())
    assert summary["resumed_trials"] == len(kept)
    assert summary["total_trials"] == len(after) >= TRIALS
    return output


@pytest.mark.slow
def test_kill_9_of_the_cli_leaves_no_process_and_loses_no_record(tmp_path):
    run = TuneRun(tmp_path / "out")
    run.wait_for_records(2)
    fleet = run.fleet()
    everything = run.processes()
    logs = _log_dirs(fleet)
    run.proc.kill()
    run.proc.wait()
    assert _gone(everything, within=10), [p.cmdline() for p in everything if _alive(p)]
    assert not [d for d in logs if os.path.exists(d)], "RPC log directories left behind"
    _resume_and_check(run, _whole(_records(run.out)))


@pytest.mark.slow
def test_torn_last_lines_are_repaired_on_resume(tmp_path):
    """A kill -9 in the middle of an append to either file of the database."""
    run = TuneRun(tmp_path / "out")
    run.wait_for_records(2)
    run.proc.kill()
    run.proc.wait()
    records, workloads = run.out / RECORDS, run.out / WORKLOADS
    kept = _whole(_records(run.out))[:-1]
    torn = _whole(_records(run.out))[-1]
    records.write_text("".join(line + "\n" for line in kept) + torn[: len(torn) // 2])
    first_workload = workloads.read_text().splitlines()[0]
    with open(workloads, "a") as f:
        f.write(first_workload[: len(first_workload) // 2])
    output = _resume_and_check(run, kept)
    assert f"repaired 1 torn line(s) in {records}" in output.replace("\n", "")
    assert f"repaired 1 torn line(s) in {workloads}" in output.replace("\n", "")
    assert _tvm_reads(run.out) == len(_records(run.out))


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_a_signal_mid_tune_stops_it_within_10_s_and_resume_finishes_it(tmp_path, sig):
    """SIGINT as a terminal's Ctrl-C sends it (to the CLI's process group), while the RPC
    server measures; SIGTERM as ``timeout`` or CI sends it, while the RPC server hangs (its
    workers frozen: the C++ scheduler waits on a device that will never answer)."""
    run = TuneRun(tmp_path / "out")
    run.wait_for_records(2)
    fleet = run.fleet()
    everything = run.processes()
    logs = _log_dirs(fleet)
    if sig == signal.SIGTERM:
        for proc in fleet:
            if "rpc_server" in " ".join(proc.cmdline()):
                for worker in proc.children(recursive=True):
                    worker.suspend()
    start = time.monotonic()
    if sig == signal.SIGINT:
        os.killpg(run.proc.pid, sig)
    else:
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
    _resume_and_check(run, _whole(_records(run.out)))
