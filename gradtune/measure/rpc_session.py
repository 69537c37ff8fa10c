"""RPC sessions that never wait forever: a lost device stops the run instead of hanging it.

MetaSchedule's ``RPCRunner`` opens one session per candidate, in a worker process, by asking
the tracker for a free server with the key. The tracker answers only once such a server is
free. When every server with the key is gone (its process killed; a server whose session
worker is killed drops out of the tracker too) or the tracker itself is gone, that request
waits forever: ``session_timeout_sec`` bounds a session once it is open, not the wait for one.
The run then hangs in silence.

``BoundedSession`` is the runner's ``f_create_session``, its seam for opening a session: it
sends the tracker the same request on a socket it can stop listening to, and reads the
tracker's summary while it waits. It gives up with ``DevicesLost`` once no server with the key
has been registered for ``wait_sec`` (an unreachable tracker counts as none), or once a
registered but busy server has not come free within ``wait_sec`` plus one session timeout
(every session gradtune opens ends within that). The candidate becomes a failed
``RunnerResult`` like any other failure: an error, never a latency. The worker process
remembers that it gave up, so the rest of the batch asks once each instead of waiting again.

The tuning loop sees only the failed results' texts. ``DeviceWatch``, a measure callback,
finds ``DevicesLost`` in them, sets the run's stop signal so that no batch is started after it,
and keeps the message; ``raise_if_lost`` raises it as a ``GradtuneError`` once the loop has
ended. Every batch measured by then is in the database, so the run resumes.
"""

from __future__ import annotations

import re
import select
import socket
import struct
import time
import uuid
from dataclasses import dataclass, field

from tvm import rpc
from tvm.ir.utils import derived_object
from tvm.rpc import base
from tvm.s_tir import meta_schedule as ms

from ..errors import GradtuneError
from ..stop import StopSignal

# Connecting to the tracker and reading one answer it has started to send: a healthy tracker
# takes milliseconds, a host that stopped answering takes forever.
TRACKER_IO_SEC = 10.0

# Per runner worker process, the ``BoundedSession``s (by token) that waited out their bound and
# have not opened a session since: they look once and do not wait again.
_gave_up: set[str] = set()


class DevicesLost(RuntimeError):
    """No server with the tracker key came free within the bounded wait."""


@dataclass(frozen=True)
class BoundedSession:
    """``RPCRunner``'s ``f_create_session``: a session from the tracker, or ``DevicesLost``.

    Parameters
    ----------
    wait_sec : float, default 60.0
        How long no server with the key may be registered (or the tracker unreachable) before
        giving up.
    poll_sec : float, default 1.0
        How often the tracker's summary is read while waiting.
    token : str, default a fresh random id
        Names this factory in its worker process's memory of having given up; copies sent to
        the worker with each candidate share it.
    """

    wait_sec: float = 60.0
    poll_sec: float = 1.0
    token: str = field(default_factory=lambda: uuid.uuid4().hex)

    def __call__(self, config: ms.runner.RPCConfig) -> rpc.RPCSession:
        address = (config.tracker_host, config.tracker_port)
        key = config.tracker_key
        retry = self.token in _gave_up
        wait = 0.0 if retry else self.wait_sec
        busy_wait = 0.0 if retry else self.wait_sec + config.session_timeout_sec
        start = last_registered = time.monotonic()
        request: socket.socket | None = None
        try:
            while True:
                registered = registered_servers(address, key)
                if registered:
                    last_registered = time.monotonic()
                elif retry:  # nothing came back since we gave up
                    break
                try:
                    if request is None and registered is not None:
                        request = tracker_connection(address)
                        base.sendjson(
                            request, [base.TrackerCode.REQUEST, key, "", config.session_priority]
                        )
                    if request is not None:
                        reply = await_reply(request, self.poll_sec)
                        if reply is not None:
                            url, port, matchkey = reply
                            session = rpc.connect(url, port, matchkey, config.session_timeout_sec)
                            _gave_up.discard(self.token)
                            return session
                except OSError:  # the tracker went away while we waited: ask again if it returns
                    if request is not None:
                        request.close()
                    request = None
                if request is None:
                    time.sleep(self.poll_sec)
                now = time.monotonic()
                if now - last_registered >= wait or now - start >= busy_wait:
                    break
        finally:
            if request is not None:
                request.close()
        _gave_up.add(self.token)
        raise DevicesLost(self.lost_message(config, registered))

    def lost_message(self, config: ms.runner.RPCConfig, registered: int | None) -> str:
        """One line on why no session could be had: ``registered`` servers were seen last
        (None: the tracker did not answer)."""
        where = f"{config.tracker_host}:{config.tracker_port}"
        if registered is None:
            return f"RPC tracker {where} unreachable for {self.wait_sec:.0f} s"
        if registered:
            return (
                f"no RPC server for key {config.tracker_key} at tracker {where} came free within"
                f" {self.wait_sec + config.session_timeout_sec:.0f} s"
                f" ({registered} registered, all busy)"
            )
        return (
            f"no RPC server for key {config.tracker_key} registered with tracker {where}"
            f" within {self.wait_sec:.0f} s"
        )


def tracker_connection(address: tuple[str, int]) -> socket.socket:
    """A socket to the tracker past its handshake; every read on it times out."""
    sock = socket.create_connection(address, timeout=TRACKER_IO_SEC)
    try:
        sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
        if struct.unpack("<i", base.recvall(sock, 4))[0] != base.RPC_TRACKER_MAGIC:
            raise OSError(f"{address[0]}:{address[1]} is not an RPC tracker")
    except BaseException:
        sock.close()
        raise
    return sock


def registered_servers(address: tuple[str, int], key: str) -> int | None:
    """Servers with ``key`` registered with the tracker, busy or free; None if it does not
    answer."""
    try:
        sock = tracker_connection(address)
        try:
            base.sendjson(sock, [base.TrackerCode.SUMMARY])
            code, summary = base.recvjson(sock)
        finally:
            sock.close()
    except (OSError, ValueError):  # refused, reset, timed out, or not a tracker's answer
        return None
    if code != base.TrackerCode.SUCCESS:
        return None
    return sum(1 for server in summary["server_info"] if server.get("key") == f"server:{key}")


def await_reply(request: socket.socket, timeout: float) -> list | None:
    """The tracker's answer to a pending request, ``[host, port, matchkey]``, or None if it has
    not answered within ``timeout`` seconds. OSError when the tracker closed the connection."""
    readable, _, _ = select.select([request], [], [], timeout)
    if not readable:
        return None
    code, value = base.recvjson(request)
    if code != base.TrackerCode.SUCCESS:
        raise RuntimeError(f"RPC tracker refused the request: {value!r}")
    return value


LOST_IN_ERROR = re.compile(rf"{DevicesLost.__name__}: (.+)")


def lost_devices(error_msg: str | None) -> str | None:
    """The ``DevicesLost`` message inside a failed result's text (a worker's traceback)."""
    found = LOST_IN_ERROR.findall(error_msg or "")
    return found[-1].strip() if found else None


@derived_object
class DeviceWatch(ms.measure_callback.PyMeasureCallback):
    """Stops the run at the first candidate that lost its devices; ``raise_if_lost`` after the
    loop reports it."""

    def __init__(self, stop: StopSignal) -> None:
        super().__init__()
        self.stop = stop
        self.lost: str | None = None

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
        self.note(runner_results)

    def note(self, runner_results: list[ms.runner.RunnerResult]) -> None:
        """Take in one measured batch's results."""
        for result in runner_results:
            message = lost_devices(result.error_msg)
            if message is not None:
                self.lost = self.lost or message
                self.stop.set()

    def raise_if_lost(self, resume: str = "the run is resumable with --resume") -> None:
        """The first lost-devices message as one ``GradtuneError`` line, ``resume`` saying how
        to go on."""
        if self.lost is not None:
            raise GradtuneError(f"{self.lost}; {resume}")
