"""A local TVM RPC fleet: one tracker and N servers on 127.0.0.1, torn down on any exit.

MetaSchedule measures through ``RPCRunner`` by tracker key, so the same code path serves this
machine (the default fleet) and a remote device (``--tracker host:port --key name``).

A TVM RPC server loads and runs whatever library a client sends it: anyone who reaches its port
runs code on this machine. So the fleet listens on the loopback interface, and any other
address is refused unless ``allow_network`` says the network is trusted.

Each member runs in a session of its own, so that a terminal's Ctrl-C (sent to the whole
foreground process group) cannot kill a server mid-measure; the fleet is stopped by its owner
instead, a process group at a time, which reaches the workers a server forks. Should the owner
die without stopping it (kill -9), each member kills its own group (``gradtune.lifeline``).
Their logs go to a temporary directory, removed with the fleet, and kept only when the fleet
failed to start, where the error names it.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from ..errors import GradtuneError

log = logging.getLogger(__name__)


@dataclass
class Tracker:
    host: str
    port: int
    key: str

    def __str__(self) -> str:
        return f"{self.host}:{self.port} key={self.key}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_tracker(spec: str, key: str | None) -> Tracker:
    """``host:port`` plus a key → Tracker; one-line error on malformed input."""
    host, sep, port = spec.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise GradtuneError(f"--tracker {spec!r} is not HOST:PORT")
    if not key:
        raise GradtuneError("--tracker needs --key naming the devices to measure on")
    return Tracker(host, int(port), key)


def query_free_servers(tracker: Tracker, timeout: float = 5.0) -> int:
    """How many servers with ``tracker.key`` the tracker currently has free."""
    from tvm import rpc

    client = rpc.connect_tracker(tracker.host, tracker.port)
    summary = client.summary()
    queue = summary.get("queue_info", {}).get(tracker.key, {})
    return int(queue.get("free", 0))


# The tracker's handshake: it answers this 4-byte magic with the same (tvm.rpc.base).
TRACKER_MAGIC = struct.pack("<i", 0x2F271)


def check_tracker(tracker: Tracker) -> None:
    """Fail early, in one line, when a user-given tracker is unreachable, is not a TVM RPC
    tracker, or has no such key."""
    where = f"RPC tracker {tracker.host}:{tracker.port}"
    try:
        sock = socket.create_connection((tracker.host, tracker.port), timeout=5)
    except OSError as err:
        raise GradtuneError(f"{where} unreachable: {err}") from None
    # TVM's own client retries a refused connection for a minute and raises on anything but a
    # tracker; its handshake, done here with a timeout, tells the cases apart at once.
    answer = b""
    with sock:
        try:
            sock.sendall(TRACKER_MAGIC)
            while len(answer) < 4 and (chunk := sock.recv(4 - len(answer))):
                answer += chunk
        except OSError:  # reset, or silence for 5 s
            pass
    if answer != TRACKER_MAGIC:
        raise GradtuneError(f"{where} is not a TVM RPC tracker (it did not answer its handshake)")
    try:
        free = query_free_servers(tracker)
    except (OSError, RuntimeError, ValueError) as err:
        raise GradtuneError(f"{where} failed to answer a query: {err}") from None
    if free == 0:
        raise GradtuneError(f"{where} has no free server with key {tracker.key!r}")


def server_threads(tracker: Tracker, timeout: float = 15.0) -> int | None:
    """How many threads a server with ``tracker.key`` runs a kernel on (TVM's
    ``runtime.NumThreads``, asked over a session); None when no session opened within about
    ``timeout`` (every server busy) or the server could not say.

    A remote server sizes its pool from its own environment, which gradtune cannot set: TVM's
    default there is half the logical CPUs on x86, so a device without SMT times every candidate
    on half its cores unless its server was started with ``TVM_NUM_THREADS``."""
    from tvm.s_tir import meta_schedule as ms

    from .rpc_session import BoundedSession, DevicesLost

    # The tracker answers a request only once a server is free: the runner's bounded session
    # gives up on a busy device (and withdraws its request) within wait + session timeout.
    half = max(int(timeout / 2), 1)
    config = ms.runner.RPCConfig(
        tracker_host=tracker.host, tracker_port=tracker.port, tracker_key=tracker.key,
        session_timeout_sec=half,
    )  # fmt: skip
    try:
        session = BoundedSession(wait_sec=half, poll_sec=0.2)(config)
        return int(session.get_function("runtime.NumThreads")())
    except (DevicesLost, OSError, RuntimeError) as err:  # the run goes on without the check
        log.debug("could not ask %s for its thread count: %s", tracker, err)
        return None


def threads_mismatch(tracker: Tracker, target_config: dict) -> str | None:
    """A one-line warning when the device's server runs kernels on another thread count than
    the target's ``num-cores`` (CPU targets only); None when they agree or it cannot tell."""
    cores = target_config.get("num-cores")
    if not cores:  # a GPU target: its kernels do not run on the server's CPU pool
        return None
    there = server_threads(tracker)
    if there is None or there == int(cores):
        return None
    return (
        f"the RPC server with key {tracker.key!r} runs kernels on {there} thread(s) but the "
        f"target has num-cores {cores}: every candidate is timed on {there}; start the server "
        f"with TVM_NUM_THREADS={cores} (TVM's default is half the logical CPUs on x86)"
    )


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback interface (``localhost``, 127.x, ::1)."""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_fleet_host(host: str, allow_network: bool) -> None:
    """Refuse, in one line, a fleet listening beyond this machine unless explicitly allowed."""
    if not is_loopback(host) and not allow_network:
        raise GradtuneError(
            f"refusing to start RPC servers on {host}: they run any library sent to them; "
            "bind 127.0.0.1, or allow_network=True on a trusted network only"
        )


@dataclass
class LocalFleet:
    """Context manager owning the tracker and server processes it starts.

    ``host`` is the address they listen on; one beyond loopback needs ``allow_network``.
    """

    num_servers: int = 1
    key: str = "gradtune-local"
    startup_timeout: float = 60.0
    host: str = "127.0.0.1"
    allow_network: bool = False
    tracker: Tracker | None = None
    _procs: list[subprocess.Popen] = field(default_factory=list)
    _log_dir: str | None = None

    def __enter__(self) -> Tracker:
        try:
            self.start()
        except GradtuneError:
            self.stop(keep_logs=True)  # the error names them
            raise
        except BaseException:
            self.stop()
            raise
        assert self.tracker is not None
        return self.tracker

    def __exit__(self, *exc) -> None:
        self.stop()

    def _spawn(self, role: str, args: list[str]) -> subprocess.Popen:
        if self._log_dir is None:
            self._log_dir = tempfile.mkdtemp(prefix="gradtune-rpc-")
        log_path = os.path.join(self._log_dir, f"rpc_{role}-{len(self._procs)}.log")
        lifeline = ["gradtune.lifeline", str(os.getpid()), "--remove", self._log_dir]
        with open(log_path, "wb") as log_file:
            proc = subprocess.Popen(
                [sys.executable, "-m", *lifeline, "gradtune.measure.fleet_member", role, *args],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc.log_path = log_path
        self._procs.append(proc)
        return proc

    def start(self) -> None:
        check_fleet_host(self.host, self.allow_network)
        port = free_port()
        self.tracker = Tracker(self.host, port, self.key)
        log.info("starting RPC tracker on %s:%d", self.host, port)
        tracker_args = ["--host", self.host, "--port", str(port), "--port-end", str(port + 1)]
        self._spawn("tracker", tracker_args)
        # The servers start beside the tracker, importing TVM while it does, and connect once
        # it listens (gradtune.measure.fleet_member).
        for _ in range(self.num_servers):
            server_port = free_port()
            server_args = ["--host", self.host, "--port", str(server_port)]
            server_args += ["--port-end", str(server_port + 1)]
            server_args += ["--tracker", f"{self.host}:{port}", "--key", self.key]
            self._spawn("server", server_args)
        self._wait(lambda: port_open(self.host, port), "RPC tracker did not start")
        # Registration takes seconds; measuring before it completes makes every trial fail.
        self._wait(
            lambda: query_free_servers(self.tracker) >= self.num_servers,
            f"{self.num_servers} RPC server(s) did not register with the tracker",
        )
        log.info("RPC fleet ready: %d server(s), key %s", self.num_servers, self.key)

    def _wait(self, ready, message: str) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            dead = [p for p in self._procs if p.poll() is not None]
            if dead:
                with open(dead[0].log_path, errors="replace") as f:
                    tail = (f.read().strip().splitlines() or ["(no output)"])[-1]
                raise GradtuneError(f"{message}: process exited ({tail}; logs in {self._log_dir})")
            try:
                if ready():
                    return
            except (OSError, RuntimeError, ValueError):
                pass
            time.sleep(0.25)
        raise GradtuneError(
            f"{message} within {self.startup_timeout:.0f} s (logs in {self._log_dir})"
        )

    def stop(self, keep_logs: bool = False) -> None:
        for proc in reversed(self._procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                    # A stopped member (a hung device, a debugger) acts on SIGTERM only once
                    # continued; left stopped, it would outlive the fleet once its leader exits.
                    os.killpg(proc.pid, signal.SIGCONT)
                except ProcessLookupError:
                    continue
        for proc in self._procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            _await_group_exit(proc.pid)
        self._procs.clear()
        if self._log_dir is not None and not keep_logs:
            shutil.rmtree(self._log_dir, ignore_errors=True)
            self._log_dir = None


def _await_group_exit(pgid: int, grace: float = 5.0) -> None:
    """The server forks a worker per session; the group leader can exit before its workers
    do. Give the group ``grace`` seconds after SIGTERM, then SIGKILL whatever is left."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False
