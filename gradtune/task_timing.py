"""How long each finished task of the current Prefect flow run took, as Prefect recorded it.

Prefect records every task run's start, end and running time (its UI and ``prefect task-run
ls`` show them); a run's summary quotes those numbers rather than timing the stages a second
time. Task-run states reach the Prefect API as events, a moment after the task ends: read
them late in a flow run, and a task not recorded yet is simply absent.

Called within a task run (a model's retune on a Dask worker, beside other models' in the same
flow run), only that task's own nested tasks count.
"""

from __future__ import annotations


def task_run_seconds() -> dict[str, float]:
    """Running seconds per finished task run of this flow run, by task-run name, in the order
    they started; empty outside a flow run."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.context import TaskRunContext
    from prefect.runtime import flow_run

    if flow_run.id is None:
        return {}
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id]))
        )
    parent_of = {str(r.id): _parent(r.task_inputs) for r in runs}
    context = TaskRunContext.get()
    mine = _parent(context.task_run.task_inputs) if context else None
    if mine is None:  # called at the top level: the top-level tasks
        runs = [r for r in runs if parent_of[str(r.id)] is None]
    else:  # called under a task: the tasks under the same top-level one
        top = _top(mine, parent_of)
        runs = [r for r in runs if str(r.id) != top and _top(str(r.id), parent_of) == top]
    finished = sorted(
        (r for r in runs if r.state is not None and r.state.is_final() and r.start_time),
        key=lambda r: r.start_time,
    )
    return {r.name: round(r.total_run_time.total_seconds(), 2) for r in finished}


def _parent(task_inputs: dict) -> str | None:
    parents = task_inputs.get("__parents__") or []
    return str(next(iter(parents)).id) if parents else None


def _top(run_id: str, parent_of: dict[str, str | None]) -> str:
    """The top-level task run above ``run_id`` (itself when it has no parent)."""
    seen = set()
    while parent_of.get(run_id) and run_id not in seen:
        seen.add(run_id)
        run_id = parent_of[run_id]
    return run_id
