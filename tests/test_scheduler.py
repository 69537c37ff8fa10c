"""The task scheduler: MetaSchedule's gradient policy, early joins, and the time budget."""

from __future__ import annotations

import dataclasses
import random
import time

import pytest

from gradtune.partition import partition
from gradtune.search.scheduler import FAILED_MS, steepest_first


def test_steepest_first_orders_tasks_by_weighted_gradient():
    """gradient = weight × (0.2 · (best 3 batches ago − best) / 3 + 0.8 · best / batches)."""
    histories = [
        [10.0, 10.0, 10.0, 10.0],  # stalled: 0.8 · 10 / 4 = 2.0
        [40.0, 20.0, 10.0, 4.0],  # improving: 0.2 · 12 + 0.8 · 1 = 3.2
        [3.0],  # one batch: 0.8 · 3 = 2.4, weight 2: 4.8
        [FAILED_MS],  # nothing works yet: last
        [],  # never joined: last
    ]
    weights = [1.0, 1.0, 2.0, 5.0, 5.0]
    order = steepest_first(histories, weights, range(5), random.Random(0))
    assert order[:3] == [2, 1, 0] and set(order[3:]) == {3, 4}
    # A terminated task is not in ``alive``.
    assert steepest_first(histories, weights, [0, 1], random.Random(0)) == [1, 0]


def test_steepest_first_picks_at_random_among_equals():
    """No history at all (every gradient equal): a seeded random order, as MetaSchedule picks
    at random then."""

    def order(seed: int) -> list[int]:
        return steepest_first([[]] * 6, [1.0] * 6, range(6), random.Random(seed))

    orders = {tuple(order(seed)) for seed in range(8)}
    assert all(sorted(o) == list(range(6)) for o in orders) and len(orders) > 1
    assert order(3) == order(3)


def test_a_batch_starts_only_if_its_tasks_last_batch_fits_in_the_time_left():
    from tvm.s_tir import meta_schedule as ms

    from gradtune.search.scheduler import GradientTaskScheduler

    now = [0.0]
    scheduler = GradientTaskScheduler(deadline=100.0, clock=lambda: now[0])
    assert scheduler.fits(0)  # nothing measured yet: no estimate, time left
    results = [
        ms.runner.RunnerResult(run_secs=[2e-3, 1e-3, 3e-3], error_msg=None),
        ms.runner.RunnerResult(run_secs=None, error_msg="build failed"),
    ]
    scheduler.picked_at[0], now[0] = 10.0, 40.0
    scheduler.joined(0, results)
    scheduler.picked_at[1], now[0] = 40.0, 60.0
    scheduler.joined(1, results[1:])
    assert scheduler.history == {0: [2.0], 1: [FAILED_MS]}  # median ms, failures as MetaSchedule
    assert scheduler.batch_s == {0: 30.0, 1: 20.0}
    now[0] = 75.0
    assert not scheduler.fits(0)  # 75 + 30 > 100
    assert scheduler.fits(1)  # 75 + 20 ≤ 100
    assert scheduler.fits(2)  # never measured: the median, 25 s
    now[0] = 80.0
    assert not scheduler.fits(2) and scheduler.fits(1)
    now[0] = 100.0
    assert not scheduler.fits(1)
    assert GradientTaskScheduler(deadline=None).fits(0)


def test_a_seeded_task_skips_the_warm_up_and_is_weighed_by_its_seed():
    from gradtune.search.scheduler import GradientTaskScheduler

    scheduler = GradientTaskScheduler()
    assert scheduler.warmup_line(4) == [0, 1, 2, 3]
    scheduler.seed(2, 0.5)
    scheduler.seed(0, 3.0)
    assert scheduler.warmup_line(4) == [1, 3]
    histories = [scheduler.history.get(i, []) for i in range(4)]
    # After the warm-up the seeds stand for a first batch: 3.0 ms outranks 0.5 ms.
    assert steepest_first(histories, [1.0] * 4, [0, 2], random.Random(0)) == [0, 2]


def test_the_warm_up_goes_round_in_the_models_order_by_stake_or_not_at_all():
    """``tune``'s warm-ups, from the latencies measured before the search: ``model`` visits
    every task in order, ``stake`` every task by weight × latency (a task with nothing
    measured first: it may be the largest), ``fresh`` likewise but the tasks the database held
    programs of after the others, ``skip`` only the tasks with nothing measured."""
    from gradtune.search.scheduler import GradientTaskScheduler
    from gradtune.tune import start_warmup

    Task = dataclasses.make_dataclass("Task", ["name", "weight"])
    tasks = [Task("small", 4), Task("big", 1), Task("broken", 1), Task("mid", 2), Task("tie", 1)]
    # Weighted: 8, 300, nothing measured, 100 and 100.
    best_us = {"small": 2.0, "big": 300.0, "mid": 50.0, "tie": 100.0}

    def line(warmup: str, held: frozenset[str] = frozenset()) -> tuple[list[int], list[str]]:
        scheduler = GradientTaskScheduler()
        skipped = start_warmup(scheduler, tasks, best_us, warmup, held)
        return scheduler.warmup_line(len(tasks)), skipped

    assert line("model") == ([0, 1, 2, 3, 4], [])
    assert line("stake") == ([2, 1, 3, 4, 0], [])  # mid and tie tie at 100: the model's order
    assert line("skip") == ([2], ["small", "big", "mid", "tie"])
    # ``fresh``: by stake too, but what the database held programs of (big, transferred) last.
    assert line("fresh", frozenset({"big"})) == ([2, 3, 4, 0, 1], [])
    assert line("fresh") == line("stake")  # a cold run: nothing held
    with pytest.raises(ValueError, match="unknown warm-up 'random'"):
        line("random")


def test_the_tasks_held_are_those_with_a_program_besides_the_default(tiny_model, llvm_target):
    """``fresh``'s tasks held: the database has a searched or transferred program of them, not
    only the default schedule every run measures first."""
    from tvm.s_tir import meta_schedule as ms

    from gradtune.measure.baseline import default_schedule
    from gradtune.symbolic.verify import design_space
    from gradtune.tune import searched_tasks

    _, tasks = partition(tiny_model.mod, tiny_model.params, llvm_target)
    database = ms.database.MemoryDatabase()

    def commit(task, trace) -> None:
        args = ms.arg_info.ArgInfo.from_prim_func(task.mod["main"])
        workload = database.commit_workload(task.mod)
        database.commit_tuning_record(
            ms.database.TuningRecord(trace, workload, [1e-3], llvm_target, args)
        )

    for task in tasks:
        commit(task, default_schedule(task.mod).trace)
    assert searched_tasks(database, tasks) == frozenset()
    _, spaces, _ = design_space(tasks[-1].mod, llvm_target, seed=3)
    commit(tasks[-1], spaces[0].trace)
    assert len(tasks) > 1 and searched_tasks(database, tasks) == {tasks[-1].name}


@pytest.mark.slow
def test_a_batch_joins_early_when_pipelined_and_is_measured_alone_on_this_host(
    tiny_model, llvm_target, tmp_path
):
    """MetaSchedule's gradient scheduler joins no batch until every task had its first one.
    Here, pipelined (the next batch generated while the last is measured, as for a remote
    device), the first task's batch is joined (its round logged) before the last task gets its
    first batch. On this host's devices (the local fleet) every batch is measured alone: each
    generation is followed by its own round before the next one starts."""
    from tvm.ir.utils import derived_object

    from gradtune.frontend import load_model
    from gradtune.measure.rpc_fleet import LocalFleet
    from gradtune.search.stoppable import Stoppable
    from gradtune.tune import tune
    from tests.conftest import EXAMPLES

    wide = load_model(EXAMPLES / "small_cnn.py", entry="tiny_mlp_wide")
    tasks = partition(tiny_model.mod, tiny_model.params, llvm_target)[1] + [
        dataclasses.replace(t, name=f"{t.name}_wide")
        for t in partition(wide.mod, wide.params, llvm_target)[1]
    ]
    assert len(tasks) >= 3
    events: list[tuple[str, str]] = []

    @derived_object
    class Recording(Stoppable._cls):
        """MetaSchedule's replay-trace, logging its batches; a task's first batch waits
        ``pause`` s after another task's (time for that one to be measured)."""

        def __init__(self, session=None, pause: float = 3.0) -> None:
            super().__init__("replay-trace", session)
            self.name, self.first, self.pause = "", True, pause

        def _initialize_with_tune_context(self, context) -> None:
            super()._initialize_with_tune_context(context)
            self.name = str(context.task_name)

        def generate_measure_candidates(self):
            if self.first and events and self.pause:
                time.sleep(self.pause)
            self.first = False
            events.append(("generate", self.name))
            return super().generate_measure_candidates()

        def clone(self):
            return Recording(self.session, self.pause)

    with LocalFleet() as tracker:
        result = tune(tasks, llvm_target, tmp_path / "pipelined", tracker,
                      max_trials=3 * len(tasks), search=Recording(), trials_per_round=2,
                      on_round=lambda r: events.append(("round", r.task)),
                      exclusive_measurement=False)  # fmt: skip
        generated = [i for i, (kind, _) in enumerate(events) if kind == "generate"]
        first_round = next(i for i, (kind, _) in enumerate(events) if kind == "round")
        assert first_round < generated[len(tasks) - 1], events
        assert {name for kind, name in events if kind == "round"} == {t.name for t in tasks}
        assert result.rounds[-1].trials == result.trials

        events.clear()
        # No pause: it could only give a batch joined too late the time to be measured.
        result = tune(tasks, llvm_target, tmp_path / "alone", tracker,
                      max_trials=3 * len(tasks), search=Recording(pause=0), trials_per_round=2,
                      on_round=lambda r: events.append(("round", r.task)))  # fmt: skip
    kinds = [kind for kind, _ in events]
    assert kinds == ["generate", "round"] * (len(kinds) // 2), events
    assert [name for _, name in events[0::2]] == [name for _, name in events[1::2]], events
    assert len(kinds) >= 2 * len(tasks)
