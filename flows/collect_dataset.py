"""Flow: measure the model zoo into a TenSet-style dataset (``gradtune dataset collect``).

``settings`` and ``tracker`` are dataclasses, which Prefect's UI renders as forms of typed
fields; ``target`` is text: "llvm" (this CPU) or a JSON target object.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from gradtune.dataset import CollectSettings
from gradtune.entrypoints import load_tasks
from gradtune.measure.rpc_fleet import Tracker
from gradtune.target import parse_target

dataset = load_tasks("dataset", __file__)


@flow(name="collect-dataset", log_prints=False)
def collect_dataset(
    out: str,
    zoo: str,
    target: str,
    settings: CollectSettings,
    max_workloads: int | None = None,
    time_budget: float | None = None,
    tracker: Tracker | None = None,
) -> dict[str, Any]:
    """zoo → deduplicated workloads → sampled, built, RPC-measured records → manifest + card."""
    manifest = dataset.collect_records(
        out,
        zoo,
        parse_target(target),
        settings,
        tracker=tracker,
        max_workloads=max_workloads,
        time_budget=time_budget,
    )
    dataset.write_card(out, manifest)
    return dataset.summarize_dataset(out)
