"""Stopping a MetaSchedule run between rounds, for ``--time-budget`` and Ctrl-C.

The only clean way to end ``tune_tasks`` early is for every task's strategy to answer "no more
candidates": the scheduler then terminates the task itself. Terminating tasks from a measure
callback instead races the gradient task scheduler, which joins a task inside ``NextTaskId``
and then asserts that the task it picked is still alive (``Check failed: !task->is_terminated``).
So every strategy gradtune runs polls the session's ``StopSignal``; ``Stoppable`` gives
MetaSchedule's own strategies (evolutionary, replay) that behaviour by delegation, and the
gradient search checks the signal itself.
"""

from __future__ import annotations

from typing import Any

from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from gradtune.search.session import ReportingStrategy, Session


@derived_object
class Stoppable(ReportingStrategy):
    """A MetaSchedule strategy (by name, or a template to clone) that stops on the signal.

    It leaves nothing in the session: its batches' ``RoundLog``s carry no ``SearchRound``.
    """

    def __init__(self, strategy: str | Any, session: Session | None = None) -> None:
        self.strategy = strategy
        self.session = session if session is not None else Session()
        self.inner: Any = None

    def _initialize_with_tune_context(self, context: Any) -> None:
        if isinstance(self.strategy, str):
            self.inner = ms.search_strategy.SearchStrategy.create(self.strategy)
        else:
            self.inner = self.strategy.clone()
        self.inner._initialize_with_tune_context(context)

    def pre_tuning(self, max_trials, num_trials_per_iter, design_spaces, database=None,
                   cost_model=None) -> None:  # fmt: skip
        self.inner.pre_tuning(max_trials, num_trials_per_iter, design_spaces, database, cost_model)

    def post_tuning(self) -> None:
        self.inner.post_tuning()

    def generate_measure_candidates(self) -> list[Any] | None:
        if self.session.stop.stopped:
            return None
        return self.session.cut(self.inner.generate_measure_candidates())

    def notify_runner_results(self, measure_candidates, results) -> None:
        self.inner.notify_runner_results(measure_candidates, results)

    def clone(self) -> Stoppable:
        return Stoppable(self.strategy, self.session)
