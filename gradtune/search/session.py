"""What the tuning loop and its search strategy share for one run: stop signal and records.

MetaSchedule tells a strategy about a measured batch (``notify_runner_results``) and then runs
the measure callbacks on the same batch, one task at a time. The loop's callback knows what
the whole run has reached (trials, best latencies, the estimated model); the strategy knows how
it chose the batch (search time, predictions, the cost model's fine-tune loss). So the loop
hands every strategy one ``Session``: the strategy leaves its account of the batch there
(``searched``), the loop's callback takes it into the batch's ``RoundLog`` (``take``), and the
run's ``RunSummary`` and ``StopSignal`` live there too. Every strategy gradtune runs is a
``ReportingStrategy``, so the loop attaches the session without asking what it was given.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from tvm.s_tir import meta_schedule as ms

from gradtune.stop import StopSignal

# Evolutions ``Session.explorer_duty`` looks back over: enough to span a few rounds of several
# tasks, few enough to follow the run as its kernels and batches change.
DUTY_WINDOW = 4


@dataclass
class SearchRound:
    """How gradtune's gradient search chose and learned from one measured batch.

    Parameters
    ----------
    predicted_best : float
        The cost model's score of its favourite pick (higher = faster).
    measured_best_us : float
        The batch's best median latency among the candidates the model learned from.
    search_s : float
        Seconds spent choosing the batch (the explorer's evolution, the descent, re-scoring).
    descent_s : float
        Of which the Adam descent over the seeds.
    measure_s : float
        Build + RPC run of the batch, from hand-over to results.
    prediction_spearman : float
        Rank correlation of the predicted scores with the measured speed of this batch, before
        fine-tuning on it (NaN for fewer than 3 measured candidates or a constant side).
    finetune_loss : float
        The cost model's ranking loss after fine-tuning on the batch (last epoch).
    dropped_seeds : int
        Seeds and picks dropped so far in the run for a NaN/inf gradient or score.
    evolved : int, default 0
        Candidates of the batch chosen by the evolutionary explorer
        (``GradientConfig.evolutionary_explore``), not by the descent.
    explorer_population : int, default 0
        The population of the evolution that chose them (0: no evolution in this batch).
    reused : bool, default False
        Whether they were the unmeasured rest of an earlier batch's evolution
        (``GradientConfig.batches_per_evolution``): no evolution in this batch.
    sampled : bool, default False
        Whether the explorer's share of this batch was drawn at random from the design space
        (``GradientConfig.random_warmup``, a task's first batch of the run) instead of evolved.
    ranked : bool, default False
        Whether those random programs were the best of more draws as the task scheduler's cost
        model ranks them (``GradientConfig.ranked_warmup``).
    explore_share : float, default NaN
        The share of the batch explored: ``GradientConfig.explore``, or AdaTune's contextual ε
        of this round (``contextual_explore``).
    mean_sigma : float, default NaN
        The ensemble's mean spread over the round's random programs, standardized (NaN
        without an ensemble acquisition).
    dropped_members : int, default 0
        Member scores left out of this round's μ and σ for being NaN or inf.
    descent_best_us, evolved_best_us : float, default inf
        The batch's best median latency among the descent's picks (its random explore share
        included) and among the explorer's (any sketch): which side found what, so a
        benchmark can say what each contributes to a task's best.
    structural : int, default 0
        Of the descent's picks, variants of the task's fastest programs
        (``GradientConfig.structural_variants``).
    structural_best_us : float, default inf
        The batch's best median latency among those variants.
    ranker_spearman : float, default NaN
        As ``prediction_spearman``, for the task scheduler's cost model's predictions of the
        descent's picks (not the variants), before it learns of this batch: NaN until it has
        seen ``RANKER_TRAINED_AT`` programs.
    reranked : bool, default False
        Whether the descent's picks were ranked with it too (``GradientConfig.ranker_blend``).
    explorer_s : float, default 0.0
        Of ``search_s``, the explorer's evolution (0 when this batch's share was drawn at
        random or reused, or there was none). On a 2-core Intel Xeon, choosing candidates took
        222–266 s of a 480 s squeeze_fire run and the descent only 67–82 s of that: this says
        how much of the rest the evolution is.
    """

    predicted_best: float
    measured_best_us: float
    search_s: float
    descent_s: float
    measure_s: float
    prediction_spearman: float
    finetune_loss: float
    dropped_seeds: int
    evolved: int = 0
    explorer_population: int = 0
    reused: bool = False
    sampled: bool = False
    ranked: bool = False
    explore_share: float = math.nan
    mean_sigma: float = math.nan
    dropped_members: int = 0
    descent_best_us: float = math.inf
    evolved_best_us: float = math.inf
    structural: int = 0
    structural_best_us: float = math.inf
    ranker_spearman: float = math.nan
    reranked: bool = False
    explorer_s: float = 0.0


@dataclass
class RoundLog:
    """One measured batch: the unit of the latency-vs-time curve and of the per-round metrics.

    Parameters
    ----------
    round : int
        1-based position of the batch in this run.
    task : str
        The task the batch belongs to.
    measured : int
        Candidates in the batch, failed ones included.
    trials : int
        Trials measured so far in this run (resumed ones excluded).
    seconds : float
        Wall-clock since tuning started.
    batch_best_us : float
        Best median latency in the batch (inf when every candidate failed).
    task_best_us : float
        Best latency of the task so far, resumed trials included.
    estimated_model_us : float
        Σ weight × best-so-far over all tasks (the untuned latency for unmeasured ones).
    search : SearchRound or None
        The gradient search's account of the batch; None for MetaSchedule's strategies and for
        a task the gradient search handed to evolutionary search.
    """

    round: int
    task: str
    measured: int
    trials: int
    seconds: float
    batch_best_us: float
    task_best_us: float
    estimated_model_us: float
    search: SearchRound | None = None


@dataclass
class RunSummary:
    """The gradient search's run totals (MLflow parameters ``search_<field>``).

    Parameters
    ----------
    cost_model : str
        Where the cost model's starting weights came from (a path or a registry model).
    fallback_tasks : list of str, default []
        Tasks none of whose sketches the symbolic layer models, searched evolutionarily.
    nan_seeds : int, default 0
        Seeds and picks dropped for a NaN/inf gradient or score.
    dropped_members : int, default 0
        Ensemble member scores left out of μ and σ for being NaN or inf.
    explorer_skipped : int, default 0
        Batches whose explorer share the descent filled because what was left of the time
        budget would not have covered an evolution and a measurement.
    """

    cost_model: str
    fallback_tasks: list[str] = field(default_factory=list)
    nan_seeds: int = 0
    dropped_members: int = 0
    explorer_skipped: int = 0


@dataclass
class Session:
    """One run's shared state between the tuning loop and every clone of its strategy.

    Parameters
    ----------
    stop : StopSignal, default StopSignal()
        Set by the time budget or Ctrl-C; every strategy then answers "no more candidates".
    summary : RunSummary or None, default None
        Run totals, created by a strategy that keeps them (the gradient search).
    pending : dict of str to SearchRound, default {}
        A strategy's account of the batch just measured, per task, until the loop takes it.
    trials_left : int or None, default None
        Candidates the run may still hand to the builder (None: no limit). MetaSchedule checks
        its global trial budget only before a batch, so a batch that does not divide what is
        left would overshoot it; strategies cut their batch to this instead.
    latency_shares : dict of str to float, default {}
        Each task's share of the model's estimated latency (weight × best µs) when the search
        starts: the default schedules', which the loop measures first, or a resumed run's best.
        Set by the loop; a task without a measured latency is not in it.
    measured : int, default 0
        Programs the run's strategies have been told the measurements of, failed ones too:
        what MetaSchedule's task scheduler has updated its cost model with so far.
    explorer_pairs : int, default 0
        Pairs of an explorer's and a descent's program measured in the same batch
        (``GradientConfig.split_by_wins``), over the run.
    explorer_wins : float, default 0.0
        Of those pairs, how many the explorer's program was faster in (a tie counts half).
    deadline : float or None, default None
        ``time.perf_counter()`` time at which the time budget ends (None: no time limit).
    explorer_s : float, default 0.0
        Seconds the run's latest explorer evolution took.
    batch_s : float, default 0.0
        Seconds from handing the run's latest batch over to being told its measurements.
    explorer_population : int, default 0
        The population every task's explorer evolves with next
        (``GradientConfig.explorer_time_share``; 0: each keeps its configured one).
    evolutions : deque of (float, float)
        ``time.perf_counter()`` start and end of the run's latest ``DUTY_WINDOW`` evolutions.
    """

    stop: StopSignal = field(default_factory=StopSignal)
    summary: RunSummary | None = None
    pending: dict[str, SearchRound] = field(default_factory=dict)
    trials_left: int | None = None
    latency_shares: dict[str, float] = field(default_factory=dict)
    measured: int = 0
    explorer_pairs: int = 0
    explorer_wins: float = 0.0
    deadline: float | None = None
    explorer_s: float = 0.0
    batch_s: float = 0.0
    explorer_population: int = 0
    evolutions: deque = field(default_factory=lambda: deque(maxlen=DUTY_WINDOW))

    def evolved(self, start: float, end: float) -> None:
        """Record one explorer evolution (any task's)."""
        self.evolutions.append((start, end))

    def explorer_duty(self) -> float | None:
        """The share of wall time the latest evolutions took, from the first one's start to
        the last one's end (None before two)."""
        if len(self.evolutions) < 2:
            return None
        span = self.evolutions[-1][1] - self.evolutions[0][0]
        busy = sum(end - start for start, end in self.evolutions)
        return busy / span if span > 0 else None

    def time_left(self) -> float:
        """Seconds until the time budget ends (inf without one)."""
        return math.inf if self.deadline is None else self.deadline - time.perf_counter()

    def allow(self, wanted: int) -> int:
        """How many of ``wanted`` candidates the trial budget still allows; counted as spent
        (``refund`` what is not handed over)."""
        if self.trials_left is None:
            return wanted
        granted = max(0, min(wanted, self.trials_left))
        self.trials_left -= granted
        return granted

    def cut(self, candidates: Any) -> list[Any] | None:
        """``candidates`` cut to what the trial budget allows; None when nothing is left (the
        strategy's "no more candidates")."""
        if candidates is None:
            return None
        return list(candidates)[: self.allow(len(candidates))] or None

    def refund(self, unused: int) -> None:
        """Return ``unused`` of the candidates ``allow`` granted."""
        if self.trials_left is not None:
            self.trials_left += max(0, unused)

    def compare_halves(self, descent_s: list[float], explorer_s: list[float]) -> None:
        """Count every (explorer, descent) pair of one batch's latencies (inf: failed)."""
        for e in explorer_s:
            for d in descent_s:
                self.explorer_pairs += 1
                self.explorer_wins += 1.0 if e < d else 0.5 if e == d else 0.0

    def searched(self, task: str, detail: SearchRound) -> None:
        """The strategy's account of ``task``'s batch, given in ``notify_runner_results``."""
        self.pending[task] = detail

    def take(self, task: str) -> SearchRound | None:
        """The account of ``task``'s batch, for its ``RoundLog`` (None if nothing was given)."""
        return self.pending.pop(task, None)


class ReportingStrategy(ms.search_strategy.PySearchStrategy):
    """A MetaSchedule ``PySearchStrategy`` that takes the run's ``Session``.

    Subclasses are ``@derived_object`` classes: they poll ``self.session.stop`` in
    ``generate_measure_candidates`` and hand the session to their clones (MetaSchedule clones
    the strategy once per task).
    """

    session: Session

    def attach(self, session: Session) -> None:
        self.session = session
