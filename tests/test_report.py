"""report.md: what a user reads of a run, stated from its summary."""

from __future__ import annotations

from gradtune.report import budget_warning


def test_a_budget_spent_in_the_warm_up_says_so_and_what_to_do():
    """With 11 tasks and batches of 25, the warm-up alone was most of a 480 s budget: 8 of
    resnet18_like's 11 tasks had one batch when it ended, and tuned for 1200 s instead its
    library ran 0.86x the time. The report says so; not when most tasks got a second batch,
    nor when the trial count, not the budget, ended the run."""
    batches = {f"t{i}": 2 if i < 3 else 1 for i in range(11)}
    summary = {"tasks": 11, "stopped_by_time_budget": True, "batches_per_task": batches}
    warning = budget_warning(summary)
    assert warning is not None and warning.startswith(
        "The time budget ended the run while 8 of 11 tasks had been measured in one batch"
    )
    assert "a larger --time-budget tunes them further" in warning
    # A task the budget left without any batch is not in the counts, and counts as one.
    assert "9 of 11" in budget_warning({**summary, "batches_per_task": {"t0": 2, "t1": 2}})
    assert budget_warning({**summary, "stopped_by_time_budget": False}) is None
    most_twice = {f"t{i}": 3 if i < 6 else 1 for i in range(11)}
    assert budget_warning({**summary, "batches_per_task": most_twice}) is None
    assert budget_warning({"tasks": 11, "stopped_by_time_budget": True}) is None  # older run
