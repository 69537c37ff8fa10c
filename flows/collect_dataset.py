"""Flow: measure the model zoo into a TenSet-style dataset (``gradtune dataset collect``)."""

from __future__ import annotations

from typing import Any

from prefect import flow

from gradtune.dataset import CollectSettings
from tasks.dataset import collect_records, summarize, write_card


@flow(name="collect-dataset", log_prints=False)
def collect_dataset(
    out: str,
    zoo: str,
    target: dict[str, Any],
    settings: dict[str, Any],
    max_workloads: int | None = None,
    time_budget: float | None = None,
    tracker: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """zoo → deduplicated workloads → sampled, built, RPC-measured records → manifest + card."""
    from gradtune.measure.rpc_fleet import Tracker

    manifest = collect_records(
        out,
        zoo,
        target,
        CollectSettings(**settings),
        tracker=Tracker(**tracker) if tracker else None,
        max_workloads=max_workloads,
        time_budget=time_budget,
    )
    write_card(out, manifest)
    return summarize(out)
