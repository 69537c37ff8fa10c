"""The quiet re-timing of each task's few best before compiling (``measure.confirm``)."""

from __future__ import annotations

import json
import time

import pytest

from gradtune.measure.baseline import default_schedule, is_default
from gradtune.measure.confirm import ACCOUNT_FILE, confirm, confirmed_database
from gradtune.measure.latency import median_seconds
from gradtune.partition import partition
from gradtune.tune import compile_database, run_database


def _program(task, target):
    """A postprocessed program of the task's first sketch, as a database keeps its trace."""
    import tvm

    from gradtune.symbolic.verify import design_space

    _, spaces, postprocs = design_space(task.mod, target, seed=3)
    sch = tvm.s_tir.Schedule(task.mod)
    spaces[0].trace.apply_to_schedule(sch, remove_postproc=False)
    sch.enter_postproc()
    assert all(p.apply(sch) for p in postprocs)
    return sch.trace.simplified(remove_postproc=False)


def _commit(database, task, trace, target, seconds: float) -> None:
    from tvm.s_tir import meta_schedule as ms

    database.commit_tuning_record(
        ms.database.TuningRecord(
            trace=trace,
            workload=database.commit_workload(task.mod),
            run_secs=[seconds] * 3,
            target=target,
            args_info=ms.arg_info.ArgInfo.from_prim_func(task.mod["main"]),
        )
    )


@pytest.fixture()
def noisy_run(tiny_model, llvm_target, tmp_path):
    """A run directory whose every task recorded its default schedule with a lucky 1 ns and a
    searched program with an unlucky 1 s: the recorded best is whichever got the luckier
    draw, not the faster program."""
    _, tasks = partition(tiny_model.mod, tiny_model.params, llvm_target)
    database = run_database(tmp_path)
    for task in tasks:
        _commit(database, task, default_schedule(task.mod).trace, llvm_target, 1e-9)
        _commit(database, task, _program(task, llvm_target), llvm_target, 1.0)
    return tasks, database


def _builder_and_runner(tracker):
    from gradtune.measure.builder import make_builder
    from gradtune.measure.runner import MeasureSettings, make_rpc_runner

    return make_builder(max_workers=2), make_rpc_runner(tracker, MeasureSettings())


def test_the_quietly_fastest_ships_with_its_quiet_timing(noisy_run, llvm_target, tmp_path):
    from gradtune.measure.rpc_fleet import LocalFleet

    tasks, database = noisy_run
    with LocalFleet() as tracker:
        builder, runner = _builder_and_runner(tracker)
        try:
            result = confirm(tasks, llvm_target, database, builder, runner, tmp_path, top_k=4)
        finally:
            runner.pool.shutdown()
            builder.shutdown()
    assert len(result.tasks) == len(tasks) and not result.unconfirmed
    confirmed = confirmed_database(tmp_path, len(database))
    assert confirmed is not None
    assert compile_database(tmp_path).get_all_tuning_records()  # the confirmed one, readable
    for account in result.tasks:
        # Both programs were re-timed: the lucky 1 ns and the unlucky 1 s are gone.
        assert account.recorded_us == [0.001, 1e6] and account.default == 0
        quiet = account.quiet_us
        assert all(1e-2 < q < 1e5 for q in quiet), quiet
        assert account.winner == quiet.index(min(quiet))
        (task,) = [t for t in tasks if t.name == account.task]
        (shipped,) = confirmed.get_top_k(confirmed.commit_workload(task.mod), 10)
        assert is_default(shipped) == (account.winner == 0)
        assert 1e6 * median_seconds(shipped.run_secs) == pytest.approx(
            quiet[account.winner], abs=1e-3
        )  # the account rounds to ns
    written = json.loads((tmp_path / ACCOUNT_FILE).read_text())
    assert written["records_at"] == len(database) == 2 * len(tasks)

    # A run that measures more afterwards is compiled from its database, not the stale winners.
    _commit(database, tasks[0], _program(tasks[0], llvm_target), llvm_target, 0.5)
    assert confirmed_database(tmp_path, len(database)) is None
    assert len(compile_database(tmp_path)) == len(database)


def test_past_its_deadline_the_recorded_bests_stand(noisy_run, llvm_target, tmp_path):
    tasks, database = noisy_run
    # Nothing is built or timed past the deadline: no builder or runner is needed.
    result = confirm(tasks, llvm_target, database, None, None, tmp_path,
                     deadline=time.perf_counter() - 1)  # fmt: skip
    assert not result.tasks and sorted(result.unconfirmed) == sorted(t.name for t in tasks)
    confirmed = confirmed_database(tmp_path, len(database))
    for task in tasks:
        (shipped,) = confirmed.get_top_k(confirmed.commit_workload(task.mod), 10)
        assert is_default(shipped)  # the lucky 1 ns record
