"""How long each finished task of the current Prefect flow run took, as Prefect recorded it.

Prefect records every task run's start, end and running time (its UI and ``prefect task-run
ls`` show them); a run's summary quotes those numbers rather than timing the stages a second
time. Task-run states reach the Prefect API as events, a moment after the task ends: read
them late in a flow run, and a task not recorded yet is simply absent.
"""

from __future__ import annotations


def task_run_seconds() -> dict[str, float]:
    """Running seconds per finished task run of this flow run, by task-run name, in the order
    they started; empty outside a flow run."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.runtime import flow_run

    if flow_run.id is None:
        return {}
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id]))
        )
    finished = sorted(
        (r for r in runs if r.state is not None and r.state.is_final() and r.start_time),
        key=lambda r: r.start_time,
    )
    return {r.name: round(r.total_run_time.total_seconds(), 2) for r in finished}
