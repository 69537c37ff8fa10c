"""One member of the local RPC fleet, the tracker or a server, serving from this process.

``python -m tvm.exec.rpc_tracker`` and ``rpc_server`` import TVM, then start a worker process
(TVM's ``PopenWorker``) that imports it again before it serves: ~4 s each on 2 cores, paid in
sequence, so the local fleet took ~11 s to be ready, and every ``gradtune tune`` waited for it.
Here each member runs the function TVM's worker would run (``_popen_start_tracker_server``,
``_popen_start_rpc_server``: the same sockets, loops and per-session forks) in this process,
which has imported TVM once. A server imports TVM while its tracker does, then waits for the
tracker's port: TVM's client retries a refused connection only every 5 s.

    python -m gradtune.measure.fleet_member tracker --host H --port P --port-end E
    python -m gradtune.measure.fleet_member server --host H --port P --port-end E \\
        --tracker H:P --key K
"""

from __future__ import annotations

import argparse
import logging
import time

from tvm.rpc import server, tracker

from .rpc_fleet import port_open


def serve_tracker(host: str, port: int, port_end: int) -> None:
    tracker._popen_start_tracker_server(host, port, port_end)
    tracker.PopenTrackerServerState.current.thread.join()


def serve_server(host: str, port: int, port_end: int, tracker_addr: str, key: str) -> None:
    from . import handoff

    handoff.register()  # each session's fork inherits it: ``--measure handoff``'s preprocessing
    tracker_host, _, tracker_port = tracker_addr.rpartition(":")
    while not port_open(tracker_host, int(tracker_port)):
        time.sleep(0.1)  # the fleet's owner stops this process if the tracker never listens
    server._popen_start_rpc_server(
        host, port, port_end, tracker_addr=(tracker_host, int(tracker_port)), key=key
    )
    server.PopenRPCServerState.current.thread.join()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gradtune.measure.fleet_member")
    parser.add_argument("role", choices=["tracker", "server"])
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--port-end", type=int, required=True)
    parser.add_argument("--tracker", help="HOST:PORT of the tracker (server only)")
    parser.add_argument("--key", default="", help="device key (server only)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)  # as TVM's scripts log: the fleet's log files
    if args.role == "tracker":
        serve_tracker(args.host, args.port, args.port_end)
    else:
        if not args.tracker:
            parser.error("a server needs --tracker HOST:PORT")
        serve_server(args.host, args.port, args.port_end, args.tracker, args.key)


if __name__ == "__main__":
    main()
