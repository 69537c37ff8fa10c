"""MetaSchedule's gradient task scheduler, joining each batch once it is measured and starting
none that cannot end within the time budget.

MetaSchedule's ``GradientBased`` scheduler first gives every task one batch (the warm-up), then
always the task whose weighted gain per batch is steepest. Two of its habits cost a run that has
a time budget:

- It joins no batch until every task has had its first. Measured programs wait unread: the
  database, the progress bar and the search strategies see nothing, and the budget, which
  ``tune`` checks when a batch is joined, cannot stop the warm-up. In the search benchmark's
  480 s runs of a 15-task model, the first batch was joined after 262 to 394 s.
- It starts a batch whatever time is left, so a run overshoots its budget by the batch under
  way: by up to 9.6% of 480 s there.

``GradientTaskScheduler`` keeps the policy and changes both. Before every pick it joins the
batches whose measurements are all in (MetaSchedule's ``TouchTask``, which ``GradientBased``
calls only after the warm-up). It starts a task's batch only if the task's last batch took (pick
to join) no longer than what is left of the budget; else the next task in line that fits; if
none does, the run ends, and MetaSchedule's loop joins what is in flight.

The warm-up is one of ``gradtune.search.WARMUPS`` (``tune``'s ``warmup``):

- ``model``: MetaSchedule's, every task in the model's order. In a cold 480 s run of
  resnet18_like on a 2-core Zen 2 it took 256 s; its two sub-µs tasks came first and its
  3.3 ms convolution was joined 231 s in.
- ``stake``: every task still, the most latency at stake first (``order_warmup``: weight ×
  the best latency measured before the search, its default schedule's at least); ``tune``'s
  default after a warm start.
- ``fresh``: every task still, by stake, but first the tasks the database held no searched
  or transferred program of before the run (``tune.searched_tasks``). After a warm start a
  transferred task's first batch rarely beats its transferred schedule, while an
  untransferred one's starts from its default schedule: in 11 warm starts of five CNNs on a
  2-core Zen 5 (``warm_warmup=8``, the warm-up by stake), the untransferred tasks' 20 first
  batches took 18% off the model's estimate per 100 s they spent, the transferred ones' 109
  took 3%.
- ``skip``: none; a task with measured programs counts them as its first batch (``seed``) and
  the gradient policy picks from the first round. After warm starts on that Zen 2 it put them
  6-48x ahead of cold tuning at 60 s, but the policy then spent the budget on the few largest
  tasks: the small ones were never searched.

Both schedulers also search and build the next batch while the last one is still being
measured. On a remote device that hides the host's work; on this host's cores (the local fleet)
it times candidates beside a compiler and a search: a 480 s tune of a CNN on a 2-core VM
recorded its programs 1.15-2.35x slower (median per task) than they time alone, and among each
task's 15 fastest the recorded order kept a Spearman of -0.09 to 0.54 with the quiet one
(0.57-0.88 between two quiet timings); measured alone, 0.94-1.11x and 0.83-0.93
(``bench/record_fidelity.py``). The search learns from that order. So with
``exclusive`` (``tune`` sets it when the devices are on this host) every batch in flight is
joined before the next one is searched for: nothing of the tune's runs beside a measurement.
"""

from __future__ import annotations

import logging
import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from gradtune.measure.latency import result_seconds

log = logging.getLogger("gradtune.search")

FAILED_MS = 1e9  # MetaSchedule's latency for a batch without a single working program


def steepest_first(
    histories: Sequence[Sequence[float]],
    weights: Sequence[float],
    alive: Sequence[int],
    rng: random.Random,
    alpha: float = 0.2,
    window: int = 3,
) -> list[int]:
    """``alive`` tasks in the order MetaSchedule's gradient scheduler would want them.

    ``histories[i]``: task i's best latency (ms) after each of its joined batches. A task's
    gradient is ``weight × (alpha · (best window batches ago − best) / window + (1 − alpha) ·
    best / batches)``: recent progress, and the latency still at stake per batch spent. A task
    without a working program comes last. When every gradient is equal (no history yet), the
    order is random, as MetaSchedule then picks at random; among partly equal ones the lower
    index first, as its ``max_element`` does.
    """
    gradient = {}
    for i in alive:
        history = histories[i]
        n = len(history)
        if n == 0 or history[-1] >= FAILED_MS:
            gradient[i] = -math.inf
            continue
        best = history[-1]
        recent = (history[-1 - window] - best) / window if n > window else 0.0
        gradient[i] = weights[i] * (alpha * recent + (1 - alpha) * best / n)
    if len(set(gradient.values())) <= 1:
        order = list(alive)
        rng.shuffle(order)
        return order
    return sorted(alive, key=lambda i: -gradient[i])


@derived_object
class GradientTaskScheduler(ms.task_scheduler.PyTaskScheduler):
    """MetaSchedule's gradient task scheduler that joins batches early and keeps a deadline.

    Parameters
    ----------
    seed : int, default 0
        Seeds the random pick among tasks of equal gradient.
    deadline : float or None, default None
        ``clock()`` time by which the run should end; None: no time limit.
    alpha, window : float, int, default 0.2, 3
        The gradient's weights (``steepest_first``); MetaSchedule's defaults.
    clock : callable, default time.perf_counter
    exclusive : bool, default False
        Join every batch in flight before picking the next task, so that no search or build
        runs while a batch is measured: for devices that share this host's cores.

    Give ``ms.tune_tasks`` its ``feedback()`` among the measure callbacks: that is how the
    scheduler learns what each joined batch measured, and how long it took.
    """

    def __init__(
        self,
        seed: int = 0,
        deadline: float | None = None,
        alpha: float = 0.2,
        window: int = 3,
        clock: Callable[[], float] = time.perf_counter,
        exclusive: bool = False,
    ) -> None:
        super().__init__()
        self.rng = random.Random(seed)
        self.deadline = deadline
        self.alpha = alpha
        self.window = window
        self.clock = clock
        self.exclusive = exclusive
        self.history: dict[int, list[float]] = {}  # per task: best ms after each joined batch
        self.picked_at: dict[int, float] = {}
        self.batch_s: dict[int, float] = {}  # per task: pick to join of its last batch
        self.warmup: list[int] | None = None  # tasks still waiting for their first batch
        self.stakes: dict[int, float] = {}  # per task: latency at stake (``order_warmup``)
        self.first: frozenset[int] = frozenset()  # tasks the warm-up visits before the others
        self.out_of_time = False

    def seed(self, task_id: int, best_ms: float) -> None:
        """Count ``best_ms`` as the task's first batch: it already has measured programs,
        which is what the warm-up batch is for, so the warm-up passes it by and the gradient
        policy weighs it from the start."""
        self.history[task_id] = [best_ms]

    def order_warmup(self, stakes: dict[int, float], first: frozenset[int] = frozenset()) -> None:
        """Visit the warm-up's tasks the most at stake first (``stakes``: per task, its share of
        the model's latency, weight × best measured), the tasks of ``first`` before the others.
        A task without a stake (nothing of it ran) goes first: it may be the largest, and only
        a batch can tell."""
        self.stakes = dict(stakes)
        self.first = frozenset(first)

    def warmup_line(self, n_tasks: int) -> list[int]:
        """The tasks the warm-up visits, in order: every one without a history; by stake
        after ``order_warmup``, else in the tasks' order."""
        line = [i for i in range(n_tasks) if i not in self.history]
        if self.stakes:
            # Stable: ties in order.
            line.sort(key=lambda i: (i not in self.first, -self.stakes.get(i, math.inf)))
        return line

    def feedback(self) -> Any:
        """The measure callback that tells this scheduler about every joined batch."""
        return _Feedback(self)

    def joined(self, task_id: int, runner_results: Sequence[Any]) -> None:
        latencies = [1e3 * result_seconds(r) for r in runner_results]
        history = self.history.setdefault(task_id, [])
        history.append(min([*latencies, *history[-1:], FAILED_MS]))
        if task_id in self.picked_at:
            self.batch_s[task_id] = self.clock() - self.picked_at.pop(task_id)

    def expected_s(self, task_id: int) -> float:
        """How long a batch of the task should take: its last one's pick to join, else the
        median over the tasks measured so far (0 before any)."""
        if task_id in self.batch_s:
            return self.batch_s[task_id]
        return statistics.median(self.batch_s.values()) if self.batch_s else 0.0

    def fits(self, task_id: int) -> bool:
        if self.deadline is None:
            return True
        now = self.clock()
        return now < self.deadline and now + self.expected_s(task_id) <= self.deadline

    def next_task_id(self) -> int:
        scheduler = self._outer()
        records = scheduler.tasks_
        if self.warmup is None:
            self.warmup = self.warmup_line(len(records))
        for i, record in enumerate(records):
            if self.exclusive and record.runner_futures is not None:
                scheduler.join_running_task(i)  # waits until the batch is measured
            else:
                scheduler.touch_task(i)  # joins the task's batch if it is all measured
        if self.warmup:
            line = list(self.warmup)
        else:
            alive = [i for i, record in enumerate(records) if not record.is_terminated]
            for i in alive:
                # After the warm-up every task has a history before the gradients are compared
                # (MetaSchedule joins them all there too).
                if records[i].runner_futures is not None and i not in self.history:
                    scheduler.join_running_task(i)
            histories = [self.history.get(i, []) for i in range(len(records))]
            weights = [float(record.task_weight) for record in records]
            line = steepest_first(histories, weights, alive, self.rng, self.alpha, self.window)
        task_id = next((i for i in line if self.fits(i)), -1)
        if task_id < 0:
            if line:  # only the deadline refuses a task
                self.out_of_time = True
                left = self.deadline - self.clock()
                log.info("time budget: %.0f s left, too short for any batch; stopping", left)
            return -1
        if task_id in self.warmup:
            self.warmup.remove(task_id)
        if records[task_id].runner_futures is not None:
            scheduler.join_running_task(task_id)
        self.picked_at[task_id] = self.clock()
        return task_id


@derived_object
class _Feedback(ms.measure_callback.PyMeasureCallback):
    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
        self.scheduler.joined(task_id, runner_results)
