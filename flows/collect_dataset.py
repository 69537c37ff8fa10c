"""Flow: measure the model zoo into a TenSet-style dataset (``gradtune dataset collect``).

``settings`` and ``tracker`` are dataclasses, which Prefect's UI renders as forms of typed
fields; ``target`` is text: "llvm" (this CPU) or a JSON target object.

SIGINT or SIGTERM during the collection stops it cleanly: the batch being measured finishes
and is stored, the RPC fleet is stopped, and the flow returns with ``"stopped": True`` (the
CLI then exits 130; a rerun resumes). The ``StopSignal`` is made and wired to the signals
inside the collect task's own call (``collect_until_signalled``), not passed in: a flow
parameter is sent to the Prefect API as JSON (a flag object has no meaning there), and
Prefect's flow engine installs its own SIGTERM handler for the run, so only a handler
installed inside the task's call (tasks run in the flow's main thread) is the one a signal
reaches. The previous handlers are restored when the collection ends.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from gradtune.dataset.settings import CollectSettings
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
    """zoo → deduplicated workloads → sampled, built, RPC-measured records → manifest + card;
    returns the dataset's summary and whether a signal stopped the collection."""
    manifest, stopped = dataset.collect_records(
        out,
        zoo,
        parse_target(target),
        settings,
        tracker=tracker,
        max_workloads=max_workloads,
        time_budget=time_budget,
    )
    dataset.write_card(out, manifest)
    return dataset.summarize_dataset(out) | {"stopped": stopped}
