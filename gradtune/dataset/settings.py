"""What a dataset collection measures per workload, and how: its own module because the
collection reads it and the manifest records it (``card``), and neither should import the other
for it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class CollectSettings:
    """What to measure per workload, and how (recorded in the manifest).

    Parameters
    ----------
    random_per_workload : int, default 96
        Random programs per workload: ReplayTrace, random decisions across all sketches.
    evolutionary_per_workload : int, default 32
        Then this many more from a short evolutionary search (XGBModel-guided).
    batch_size : int, default 16
        Candidates built and measured together, and committed together.
    max_failures_per_workload : int, default 64
        Failed candidates after which a workload that keeps failing is given up on.
    builder_workers : int, default 2
        Build worker processes.
    build_timeout_sec : float, default 30.0
        A slower build counts as a failure: some random programs (huge unrolls of a
        reduction) take minutes to compile and would stall the collection.
    rpc_servers : int, default 1
        Servers of the local RPC fleet, and runs in flight over RPC.
    number : int, default 2
        Runs averaged into one measurement.
    repeat : int, default 3
        Measurements per candidate (its ``run_secs``).
    min_repeat_ms : int, default 10
        Shortest duration of one measurement (TVM raises ``number`` to fill it).
    seed : int, default 0
        Seed of the sampling and the searches.
    server_wait_sec : float, default 60.0
        Longest time with no RPC server for the key registered with the tracker before the
        collection stops, resumable: a remote device that reboots between batches needs
        longer, a test of the stop far less.
    """

    random_per_workload: int = 96
    evolutionary_per_workload: int = 32
    batch_size: int = 16
    max_failures_per_workload: int = 64
    builder_workers: int = 2
    build_timeout_sec: float = 30.0
    rpc_servers: int = 1
    number: int = 2
    repeat: int = 3
    min_repeat_ms: int = 10
    seed: int = 0
    server_wait_sec: float = 60.0

    @property
    def target_per_workload(self) -> int:
        return self.random_per_workload + self.evolutionary_per_workload
