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

A collection that ran to its end is versioned: ``dvc add`` of ``out`` when it lies in a DVC
repository (``gradtune.dataset.versioning``), then ``dvc push`` to ``remote`` (None: the
repository's default) when ``push`` is set. A push that could not happen is refused before
anything is measured. A collection stopped by a signal is not versioned: a rerun resumes it.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from gradtune import flow_logging
from gradtune.dataset.settings import CollectSettings
from gradtune.dataset.versioning import check_versioning
from gradtune.entrypoints import load_tasks
from gradtune.measure.rpc_fleet import Tracker
from gradtune.target import parse_target
from gradtune.threads import use_target_threads

dataset = load_tasks("dataset", __file__)
flow_logging.one_line_user_errors()


@flow(name="collect-dataset", log_prints=False)
def collect_dataset(
    out: str,
    zoo: str,
    target: str,
    settings: CollectSettings,
    max_workloads: int | None = None,
    time_budget: float | None = None,
    tracker: Tracker | None = None,
    dvc_add: bool = True,
    push: bool = False,
    remote: str | None = None,
) -> dict[str, Any]:
    """zoo → deduplicated workloads → sampled, built, RPC-measured records → manifest + card
    → ``dvc add`` (+ ``dvc push``); returns the dataset's summary, whether a signal stopped the
    collection, and the ``.dvc`` file written (None: not versioned)."""
    check_versioning(out, push, remote)
    target_config = parse_target(target)
    use_target_threads(target_config)  # before any kernel runs here or on the local fleet
    with flow_logging.to_run_logs():
        manifest, stopped = dataset.collect_records(
            out,
            zoo,
            target_config,
            settings,
            tracker=tracker,
            max_workloads=max_workloads,
            time_budget=time_budget,
        )
        dataset.write_card(out, manifest)
        summary = dataset.summarize_dataset(out) | {"stopped": stopped, "dvc_file": None}
        if dvc_add and not stopped:
            summary["dvc_file"] = dataset.add_to_dvc(out)
            if push and summary["dvc_file"]:
                dataset.push_to_dvc_remote(summary["dvc_file"], remote)
    return summary
