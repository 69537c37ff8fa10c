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

import json
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


def target_cores(target: str | None) -> int | None:
    """The ``num-cores`` a target measures on (a JSON target object), None when it names none."""
    if not target or not target.lstrip().startswith("{"):
        return None
    cores = json.loads(target).get("num-cores")
    return int(cores) if cores else None


def remote_devices(tracker: str | None, models: int) -> int | None:
    """Devices to plan for when measurement is remote: the tracker hands each device to one
    session at a time, so concurrent tunings queue for devices and never time each other; what
    they share here is the builds' CPU. None when measurement is local."""
    if not tracker:
        return None
    return min(models, os.cpu_count() or 1)


def current_api_url() -> str:
    """The Prefect API this process reports to: the configured server, or the temporary one
    Prefect started for the CLI's in-process flow run."""
    from prefect.client.orchestration import get_client

    return str(get_client(sync_client=True).api_url)


def dask_task_runner(address: str | None, workers: int, api_url: str | None = None) -> Any:
    """``DaskTaskRunner`` on the cluster at ``address``, or on a new local cluster of
    ``workers`` single-threaded worker processes (closed with the flow run).

    ``api_url``: the Prefect API the local workers report their task runs to. Without it a
    worker of a flow run on Prefect's temporary server (no ``PREFECT_API_URL``) would start a
    temporary server of its own, and the flow run would never see its tasks. Workers of a
    user's cluster report where their own environment says."""
    from prefect_dask import DaskTaskRunner

    if address:
        return DaskTaskRunner(address=address)
    cluster = {
        "n_workers": workers,
        "threads_per_worker": 1,
        "processes": True,
        # The dashboard would take port 8787, which may be another user's.
        "dashboard_address": None,
    }
    if api_url:
        cluster["env"] = {"PREFECT_API_URL": api_url}  # passed to each worker's nanny
    return DaskTaskRunner(cluster_kwargs=cluster)


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
