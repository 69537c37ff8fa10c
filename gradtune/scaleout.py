"""Tuning several models at once on Dask, through Prefect's ``DaskTaskRunner``.

A flow that tunes several models (``retune``) submits one task per model to a Dask cluster:
a ``LocalCluster`` of worker processes by default, or the user's cluster when they name its
scheduler (``--dask-address tcp://host:8786``). Worker processes, not threads: TVM keeps
global state per process, and a model's tuning starts its own RPC fleet.

How many models run at once on a local cluster is what the measurements allow. Each tuning
measures its candidates on the target's cores; two tunings measuring on the same cores time
each other's load, not their programs. So a local cluster gets one worker per
``num-cores`` of the target (one on this 2-core machine), unless measurement happens
elsewhere (an RPC tracker of remote devices), where the limit is the devices the tracker
has free.
"""

from __future__ import annotations

import os
from typing import Any


def local_workers(models: int, cores_per_tuning: int | None, remote_devices: int | None) -> int:
    """Worker processes of the default local cluster.

    Parameters
    ----------
    models : int
        Models the flow run tunes.
    cores_per_tuning : int or None
        The target's ``num-cores`` when it measures on this machine; None for the machine's
        cores.
    remote_devices : int or None
        Free devices behind an RPC tracker when measurement is remote; None when it is local.
    """
    if remote_devices is not None:
        limit = remote_devices
    else:
        cores = os.cpu_count() or 1
        limit = cores // max(1, cores_per_tuning or cores)
    return max(1, min(models, limit))


def dask_task_runner(address: str | None, workers: int) -> Any:
    """``DaskTaskRunner`` on the cluster at ``address``, or on a new local cluster of
    ``workers`` single-threaded worker processes (closed with the flow run)."""
    from prefect_dask import DaskTaskRunner

    if address:
        return DaskTaskRunner(address=address)
    return DaskTaskRunner(
        cluster_kwargs={
            "n_workers": workers,
            "threads_per_worker": 1,
            "processes": True,
            # The dashboard would take port 8787, which may be another user's.
            "dashboard_address": None,
        }
    )


def check_address(address: str) -> None:
    """One clear line for a scheduler address Dask cannot parse (before any server starts)."""
    from distributed.comm import parse_address
    from distributed.comm.addressing import parse_host_port
    from distributed.comm.registry import backends

    scheme, location = parse_address(address)
    if scheme not in backends:
        raise ValueError(
            f"--dask-address {address!r}: unknown protocol {scheme!r} "
            f"(a Dask scheduler listens on {', '.join(sorted(backends))}, e.g. tcp://host:8786)"
        )
    if scheme in ("tcp", "tls", "ws", "wss"):
        try:
            parse_host_port(location)
        except ValueError as err:
            raise ValueError(f"--dask-address {address!r} is not host:port: {err}") from None
