"""Felix's gradient search (Algorithm 1) as a MetaSchedule ``PySearchStrategy``.

Only the choice of candidates is gradtune's: MetaSchedule's gradient task scheduler picks which
task gets the next round (Felix Algorithm 2), its builder and runner measure the batch, and the
results land in the JSONDatabase like any other strategy's. The choice differentiates the cost
model's score through the symbolic schedule's smooth feature formulas (``gradtune.symbolic``).
One cost model (``costmodel.online``) is shared by every task's clone, so what one task
measures teaches the search of the others. A task none of whose sketches the symbolic layer can
model is searched by MetaSchedule's EvolutionarySearch instead (logged and counted in the run's
``RunSummary``), never aborting the run.
"""

from __future__ import annotations

import json
import logging
import math
import time
from typing import Any, NamedTuple

import numpy as np
import torch
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from gradtune.costmodel.ensemble import Scale
from gradtune.costmodel.online import OnlineCostModel
from gradtune.costmodel.train import ranks, spearman
from gradtune.measure.latency import median_seconds, result_seconds
from gradtune.search.acquisition import contextual_epsilon, log_expected_improvement
from gradtune.search.session import ReportingStrategy, RunSummary, SearchRound, Session
from gradtune.search.structural import StructuralNeighbours, register_lanes
from gradtune.symbolic.sketch import SymbolicSketch, decision_key, replay_together
from gradtune.symbolic.variables import sampling_insts_of
from gradtune.target import is_gpu as target_is_gpu

log = logging.getLogger("gradtune.search")

# Programs MetaSchedule's XGBoost must be trained on before it predicts rather than scores at
# random (its ``num_warmup_samples``, 100 by default, which ``tune`` keeps).
RANKER_TRAINED_AT = 100
# How many of a task's fastest measured programs ``structural_variants`` takes variants of.
STRUCTURAL_ELITES = 4
# Bounds of the explorer's population under ``explorer_time_share``: below 64 an evolution has
# too few programs to mutate from to be worth its round; the ceiling is ``explorer_population``.
EXPLORER_MIN_POPULATION = 64


def resized_population(population: int, duty: float | None, share: float, ceiling: int) -> int:
    """The explorer's next population (``GradientConfig.explorer_time_share``): halved while
    its evolutions take more than ``share`` of the run's time (``duty``), doubled while they
    take less than half of it, within [``EXPLORER_MIN_POPULATION``, ``ceiling``]. Powers of
    two from the ceiling, so it settles instead of chasing every round's noise."""
    floor = min(EXPLORER_MIN_POPULATION, ceiling)
    if duty is None:
        return population
    if duty > share:
        return max(floor, population // 2)
    if duty < share / 2:
        return min(ceiling, population * 2)
    return population


class GradientConfig(NamedTuple):
    """Gradient search configuration (Felix's nSeeds and nSteps; its nMeasure is the task
    scheduler's batch, ``trials_per_round``). What each lever was measured to do, and why its
    default is what it is, is in docs/search_levers.md.

    Parameters
    ----------
    seeds : int, default 8
        Starting points per round, spread over the task's modelled sketches (⌈seeds /
        sketches⌉ in each, so at least one); Felix's nSeeds.
    steps : int, default 64
        Adam steps per round; fewer than Felix's 200, more than the 16 that already move a
        variable by up to ~3 in log2 space from a seed: the longer descent settles nearer the
        cost model's optimum. On two held-out models (Zen 2, 480 s, 3 repeats) 64 gave
        libraries 1.09x (a SqueezeNet fire CNN) and 1.13x (a BERT block) as fast as 16's,
        timed side by side, for ~10% fewer trials.
    lr : float, default 0.5
        Adam's learning rate on the variables, which live in log2 space (a step of 1 doubles a
        tile factor).
    decay_at : float, default 0.3
        Fraction of the steps after which the learning rate drops to a fifth (Felix's
        schedule): long moves first, then settling.
    penalty_weight : float, default 10.0
        λ in O(x) = −score(features(x)) + λ · penalties(x): how hard the descent is pushed back
        into the region where points round to valid decisions.
    explore : float, default 0.125
        Without the explorer, the share of each batch drawn at random from the candidates
        below the cut rather than by score (Felix's 1 in 8): a guard against the cost model's
        blind spots.
    elite : float, default 0.0
        Share of the seeds started from the task's fastest measured programs (this run's and
        the database's), each in its own sketch, instead of at random, as MetaSchedule's
        evolution starts from the database's best.
    warm_elite : float, default 0.5
        Share of a task's first round's seeds started from the programs the database held
        before the run (a resumed run's, a warm start's transferred schedules), whatever
        ``elite`` is.
    database_online : int, default 32
        The database's fastest programs of a task the cost model is fine-tuned on before the
        task's first round.
    per_seed_first : bool, default False
        Fill the exploited part of a batch with each seed's best-scored candidate first, then
        by score, so one trajectory's neighbouring iterates cannot take the whole batch.
    evolutionary_explore : bool, default True
        Fill ``evolved`` of each batch with MetaSchedule's ``EvolutionarySearch`` (the
        explorer), scoring with the XGBoost the task scheduler trains on every measured
        program; the descent fills the rest. Why: the features give whether a vector fills
        whole registers, or whether a small kernel is better on one thread, only as
        magnitudes, which the MLP is smooth in; trees split on exact values and mutations move
        one decision at a time, so the explorer reaches programs the descent rounds past.
    evolved : float, default 0.5
        The explorer's share of each batch.
    explorer_population : int, default 512
        Population of the explorer's evolution (MetaSchedule's default); a round's evolution
        costs time in proportion to it.
    explorer_time_share : float, default 0.0
        Above 0, the population follows the run's clock: after each evolution it halves while
        the latest evolutions took more than this share of the wall time, and doubles while
        they took under half of it, between ``EXPLORER_MIN_POPULATION`` and
        ``explorer_population``.
    explorer_in_warmup : bool, default True
        Whether the explorer fills its share of a task's first batch; off, that batch's
        explore share is ``explore``, drawn from the descent's candidates. Its XGBoost scores
        at random until it has seen ``RANKER_TRAINED_AT`` programs.
    random_warmup : bool, default True
        Fill the explorer's share of a task's first batch with programs whose every decision
        is drawn at random (MetaSchedule's ``ReplayTrace``) instead of by an evolution, which
        costs up to ~40 s on a convolution and, that early, ranks at random anyway; also when
        the database already holds programs of the task (a warm start's, a resumed run's),
        which the descent seeds from and the pretrained model fine-tunes on anyway.
    ranked_warmup : int, default 256
        With ``random_warmup``, once the run has measured ``RANKER_TRAINED_AT`` programs:
        draw this many random programs and keep the share's worth the task scheduler's cost
        model ranks best. 0 keeps the first ones drawn.
    ranker_blend : float, default 0.0
        Once the task scheduler's cost model has seen ``RANKER_TRAINED_AT`` programs, rank the
        descent's candidates by ``(1 − w) ×`` their rank by the MLP ``+ w ×`` their rank by
        that model (ranks: the two scores share no scale); 0 keeps the MLP's order.
    split_by_wins : bool, default False
        Set the explorer's share of a batch to the share of same-batch pairs (an explorer's
        program against a descent's, in the batches it evolved for) its programs won so far in
        the run, within ``split_bounds``. Pairs, not each half's best, so the half with more
        candidates gains no edge.
    split_bounds : tuple of float, default (0.25, 0.75)
        The clamp of ``split_by_wins``: each side keeps at least a quarter of a batch, so a
        side that lost early can still show it has caught up.
    explorer_every : int, default 1
        The explorer fills its share of every ``explorer_every``-th batch of a task; the
        descent fills the others whole, ``explore`` of them drawn at random.
    batches_per_evolution : int, default 1
        How many of a task's batches one evolution fills: it picks that many shares at once,
        ranked by the task scheduler's cost model, and the task's next batches take the
        unmeasured rest, best first (while it fills at least half a share; the descent fills
        what it does not), before it evolves again.
    acquisition : {"score", "ei"}, default "score"
        What the descent climbs and the picks are ranked by. ``score`` is Felix's: the MLP's
        score. ``ei`` is AdaTune's: the expected improvement of the ensemble's standardized
        mean and spread over the task's best measured program (``search.acquisition``; needs
        an ensemble cost model, ``OnlineCostModel.ensemble``).
    contextual_explore : bool, default False
        Replace the fixed ``explore`` share by AdaTune's contextual ε (Eq. 3) computed each
        round from the ensemble over random programs, clamped to ``explore_bounds``; logged
        per round as ``SearchRound.explore_share``. Needs an ensemble cost model.
    explore_bounds : tuple of float, default (0.05, 0.5)
        The clamp of the contextual ε: never fewer than 1 in 20 candidates explored (a
        confident model can still be wrong), never more than half of a batch.
    warmup : int or None, default None
        Candidates in a task's first batch, when fewer than the task scheduler's batch: every
        task gets its first batch before any gets a second, so a model of many tasks waits
        long for its first results. None sends the full batch.
    warm_warmup : int or None, default 8
        Candidates in the first batch of a task whose database already held measured programs
        of it when the run began (a warm start's transferred schedules, a resumed run's), when
        fewer than ``warmup`` and the batch: such a task's descent starts from those programs
        and its cost model has learnt them, so the task scheduler's warm-up, which gives every
        task a batch before the gradient policy picks, can spend less on it. None gives it the
        whole batch.
    warm_explore : bool, default True
        Whether the explorer fills its share of that first batch of a task the database held
        programs of (random draws with ``random_warmup``); off, the descent from those programs
        fills the batch, ``explore`` of it drawn at random from its candidates. After a warm
        start the descent seeds from the transferred schedules while a random draw knows none
        of them.
    build_at_first_batch : bool, default True
        Build a task's symbolic sketches (and its explorer) when it is first asked for a
        batch, not in ``pre_tuning``, which MetaSchedule calls for every task before the first
        batch: each task's build then overlaps the measurement of the batches before it.
    structural_variants : int, default 3
        Up to this many of the descent's picks of each batch after a task's first (at most a
        quarter of them, at least one) are instead unmeasured variants of the task's
        ``STRUCTURAL_ELITES`` fastest programs: each one's one-thread variant and its
        whole-register variants, ordered by score (``search.structural``; CPUs only). The
        measurement, not the model, decides whether a variant is better. 0 turns it off.
    one_thread_below_us : float, default 0.0
        Above 0, ``structural_variants`` builds the one-thread variant only of programs
        measured faster than this many µs (their whole-register variants still of every one).
    warmup_by_share : bool, default False
        Size a task's first batch by its share s of the model's estimated latency when the
        search starts (weight × the default schedule's latency, over all n tasks;
        ``Session.latency_shares``): ⌈n · s · batch⌉ candidates, at least 2, at most the batch.
    """

    seeds: int = 8
    steps: int = 64
    lr: float = 0.5
    decay_at: float = 0.3
    penalty_weight: float = 10.0
    explore: float = 0.125
    elite: float = 0.0
    warm_elite: float = 0.5
    database_online: int = 32
    per_seed_first: bool = False
    evolutionary_explore: bool = True
    evolved: float = 0.5
    explorer_population: int = 512
    explorer_time_share: float = 0.0
    explorer_in_warmup: bool = True
    random_warmup: bool = True
    ranked_warmup: int = 256
    ranker_blend: float = 0.0
    split_by_wins: bool = False
    split_bounds: tuple[float, float] = (0.25, 0.75)
    explorer_every: int = 1
    batches_per_evolution: int = 1
    acquisition: str = "score"
    contextual_explore: bool = False
    explore_bounds: tuple[float, float] = (0.05, 0.5)
    warmup: int | None = None
    warm_warmup: int | None = 8
    warm_explore: bool = True
    build_at_first_batch: bool = True
    warmup_by_share: bool = False
    structural_variants: int = 3
    one_thread_below_us: float = 0.0

    def as_json(self) -> dict[str, Any]:
        """Every field as a JSON record gives it back (tuples as lists), so the two compare."""
        return json.loads(json.dumps(self._asdict()))

    @property
    def needs_ensemble(self) -> bool:
        return self.acquisition == "ei" or self.contextual_explore


@derived_object
class GradientSearch(ReportingStrategy):
    """Felix's Algorithm 1 for one task per clone; every clone shares the cost model and session.

    A round (``generate_measure_candidates``): ``seeds`` random points spread over the modelled
    sketches, each inside its sketch's constraint region; ``steps`` Adam steps on
    O(x) = −score(features(x)) + λ · penalties(x), the features being the sketch's smooth
    symbolic formulas and the score the Felix MLP; every iterate rounded to valid decisions,
    duplicates and already-measured ones (this run's and the database's) dropped; the rest
    re-scored at their integer points; the best ``num_trials_per_iter`` of them (minus the
    ``explore`` share, drawn at random) go to MetaSchedule's builder and runner.
    ``notify_runner_results`` fine-tunes the cost model on the measured batch and leaves a
    ``SearchRound`` in the session.

    Parameters
    ----------
    cost_model : OnlineCostModel or None, default None
        The score to descend and fine-tune; None loads ``OnlineCostModel.default()``.
    config : GradientConfig or None, default None
        Seeds, steps and the rest; None for the defaults.
    session : Session or None, default None
        The run's session (``tune`` attaches its own); its ``RunSummary`` is created here.
    """

    def __init__(
        self,
        cost_model: OnlineCostModel | None = None,
        config: GradientConfig | None = None,
        session: Session | None = None,
    ) -> None:
        self.cost_model = cost_model if cost_model is not None else OnlineCostModel.default()
        self.config = config or GradientConfig()
        if self.config.acquisition not in ("score", "ei"):
            raise ValueError(
                f"acquisition must be 'score' or 'ei', not {self.config.acquisition!r}"
            )
        if not 0.0 <= self.config.explorer_time_share < 1.0:
            raise ValueError(
                f"explorer_time_share must be in [0, 1), not {self.config.explorer_time_share}"
            )
        if not 0.0 <= self.config.ranker_blend <= 1.0:
            raise ValueError(f"ranker_blend must be in [0, 1], not {self.config.ranker_blend}")
        if self.config.explorer_every < 1:
            raise ValueError(f"explorer_every must be at least 1, not {self.config.explorer_every}")
        if self.config.batches_per_evolution < 1:
            raise ValueError(
                f"batches_per_evolution must be at least 1, not {self.config.batches_per_evolution}"
            )
        if self.config.needs_ensemble and len(self.cost_model.members) < 2:
            raise ValueError(
                "acquisition='ei' and contextual_explore need an ensemble cost model "
                "(OnlineCostModel.ensemble)"
            )
        self.attach(session if session is not None else Session())
        self.context: Any = None
        self.sketches: list[SymbolicSketch] = []
        self.fallback: Any = None
        self.explorer: Any = None  # EvolutionarySearch filling the explore share
        self._explorer_args: tuple = ()  # its pre_tuning arguments, to rebuild it resized
        self._population = 0  # its population
        # The last evolution's programs and the batches they have filled
        # (``batches_per_evolution``).
        self._evolved: list[Any] = []
        self._evolved_uses = 0
        self._reused = False  # whether this batch's explored share came from an earlier one
        self.structural: StructuralNeighbours | None = None  # ``structural_variants``
        self._structural = 0  # of them in this batch
        self.ranker: Any = None  # the task scheduler's cost model (``ranked_warmup``)
        # pre_tuning's arguments while the task's setup waits for its first batch
        # (``build_at_first_batch``).
        self._setup_args: tuple | None = None
        # Per modelled sketch: its instruction count and text without decisions; and the text
        # of its simplified trace (dead instructions and postprocessors dropped).
        self.signatures: list[tuple[int, str]] = []
        self.simple_signatures: list[str] = []
        self.measured: set = set()  # (sketch index, decision key)
        self.history: list[tuple[float, int, dict]] = []  # (seconds, sketch index, decisions)
        self.remaining = 0
        self.per_iter = 0
        self.batches = 0  # handed to the builder by this task's strategy in this run
        self.rng = np.random.default_rng(0)
        # Per candidate handed over: (sketch index, decisions), (-1, None) for an explorer's
        # program no modelled sketch matches; the explorer's come last.
        self._pending: list[tuple[int, dict | None]] = []
        self._explored = 0
        self._sampled = False  # whether this batch's explored share was drawn at random
        self._ranked = False  # ... and ranked by the task scheduler's cost model
        self._design_spaces: list = []
        self._last_search_s = 0.0
        self._last_descent_s = 0.0
        self._last_explorer_s = 0.0
        self._last_predicted = 0.0
        self._pending_scores: list[float] = []
        # The ranker's predictions of the descent's picks (NaN where it gave none): how well
        # it would have ranked the batch (``SearchRound.ranker_spearman``).
        self._pending_ranker: list[float] = []
        self._reranked = False  # whether the descent's picks were ranked with the ranker too
        self._picked_ranker: list[float] = []  # of ``_pick``'s picks, in their order
        self._handed_over = 0.0
        # The round's acquisition context (``_calibrate``): the members' scale over random
        # programs, the incumbent's μ, the explore share, and the members dropped for a
        # non-finite score.
        self._scale: Any = None
        self._incumbent = 0.0
        self._explore_share = self.config.explore
        self._exploring = False  # whether the explorer fills this round's explore share
        # Rounds the explorer could have filled since it last did (explorer_every): the first
        # it may fill, it does.
        self._since_explored = self.config.explorer_every - 1
        self._mean_sigma = math.nan
        self._dropped_members = 0

    def attach(self, session: Session) -> None:
        """Share ``session``; the first clone to see it starts the run's ``RunSummary``."""
        if session.summary is None:
            session.summary = RunSummary(cost_model=self.cost_model.source)
        self.session = session
        self.summary: RunSummary = session.summary

    # -- MetaSchedule interface ---------------------------------------------------------------
    def _initialize_with_tune_context(self, context: Any) -> None:
        self.context = context
        self.rng = np.random.default_rng(int(context.rand_state) & 0xFFFFFFFF)

    def pre_tuning(self, max_trials, num_trials_per_iter, design_spaces, database=None,
                   cost_model=None) -> None:  # fmt: skip
        self.remaining = int(max_trials)
        self.per_iter = int(num_trials_per_iter)
        setup = (max_trials, num_trials_per_iter, design_spaces, database, cost_model)
        if self.config.build_at_first_batch:
            self._setup_args = setup
        else:
            self._setup(*setup)

    def _setup(self, max_trials, num_trials_per_iter, design_spaces, database, cost_model) -> None:
        """The symbolic sketches, what the database already holds of the task, and the
        explorer (or the evolutionary fallback)."""
        self._setup_args = None
        mod = self.context.mod
        postprocs = list(self.context.space_generator.postprocs)
        is_gpu = target_is_gpu(self.context.target)
        self.sketches, self.signatures, self.simple_signatures = [], [], []
        for space in design_spaces:
            try:
                sym = SymbolicSketch.build(
                    mod, space.trace, postprocs, is_gpu, rng=self.rng, target=self.context.target
                )
            except Exception as err:  # a sketch the symbolic layer cannot model
                log.warning("%s: sketch not modelled (%s)", self.context.task_name, err)
                continue
            if sym.variables.dim > 0 and sym.replay(sym.variables.sketch_decisions()):
                self.sketches.append(sym)
                n = len(space.trace.insts)
                self.signatures.append((n, trace_signature(space.trace, n)))
                self.simple_signatures.append(simple_signature(space.trace))
        if database is not None:
            self._load_measured(database)
        self.ranker = cost_model
        if self.config.structural_variants > 0 and not is_gpu:
            lanes = register_lanes(self.context.target)
            self.structural = StructuralNeighbours(lanes) if lanes > 0 else None
        if not self.sketches:
            self.summary.fallback_tasks.append(str(self.context.task_name))
            log.warning("%s: no sketch can be modelled; evolutionary search instead",
                        self.context.task_name)  # fmt: skip
            self.fallback = ms.search_strategy.EvolutionarySearch()
            self.fallback._initialize_with_tune_context(self.context)
            self.fallback.pre_tuning(max_trials, num_trials_per_iter, design_spaces, database,
                                     cost_model)  # fmt: skip
        elif self.config.evolutionary_explore and database is not None and cost_model is not None:
            # Sized for the largest share a round may ask of it.
            cfg = self.config
            share = cfg.explore_bounds[1] if cfg.contextual_explore else cfg.evolved
            if cfg.split_by_wins:
                share = max(share, cfg.split_bounds[1])
            size = self._explore_count(self.per_iter, share) * cfg.batches_per_evolution
            if size > 0:
                self._design_spaces = list(design_spaces)
                self._explorer_args = (max_trials, size, design_spaces, database, cost_model)
                self._build_explorer(self.session.explorer_population or cfg.explorer_population)
        self._explore_share = self.config.evolved if self.explorer else self.config.explore

    def _build_explorer(self, population: int) -> None:
        """A fresh explorer of ``population``. MetaSchedule's ``EvolutionarySearch`` fixes its
        population when built, and keeps nothing across rounds that a new one lacks: every
        evolution starts from the database's fastest programs, and what was measured is
        filtered here (``_unmeasured``)."""
        if self.explorer is not None:
            self.explorer.post_tuning()
        self.explorer = ms.search_strategy.EvolutionarySearch(population_size=population)
        self.explorer._initialize_with_tune_context(self.context)
        self.explorer.pre_tuning(*self._explorer_args)
        self._population = population

    def post_tuning(self) -> None:
        for strategy in (self.fallback, self.explorer):
            if strategy is not None:
                strategy.post_tuning()

    def _first_batch(self, count: int) -> int:
        """How many of ``count`` candidates the task's first batch gets (``warmup``,
        ``warm_warmup``, ``warmup_by_share``)."""
        cfg = self.config
        if cfg.warmup is not None:
            count = min(count, cfg.warmup)
        if cfg.warm_warmup is not None and self.history:  # the database's programs
            count = min(count, cfg.warm_warmup)
        shares = self.session.latency_shares
        share = shares.get(str(self.context.task_name))
        if cfg.warmup_by_share and share is not None:
            count = min(count, max(2, math.ceil(len(shares) * share * self.per_iter)))
        return count

    def _explore_count(self, count: int, share: float | None = None) -> int:
        return int(round((self._explore_share if share is None else share) * count))

    def generate_measure_candidates(self) -> list[Any] | None:
        if self.session.stop.stopped:
            return None
        if self._setup_args is not None:
            self._setup(*self._setup_args)
            # Building the sketches takes seconds; a stop asked meanwhile must not wait for a
            # whole new batch to be searched, built and measured too.
            if self.session.stop.stopped:
                return None
        if self.fallback is not None:
            return self.session.cut(self.fallback.generate_measure_candidates())
        if self.remaining <= 0:
            return None
        start = time.perf_counter()
        count = min(self.per_iter, self.remaining)
        if self.batches == 0:
            count = self._first_batch(count)
        count = self.session.allow(count)
        if count == 0:
            return None
        self._dropped_members = 0
        if self.config.needs_ensemble:
            self._calibrate()
        first = self.batches == 0
        # Off, warm_explore leaves a warm task's first batch to the descent, which the
        # database's programs (a warm start's, a resumed run's) seed; a random draw knows none.
        explores = self.explorer is not None and not (
            first and self.history and not self.config.warm_explore
        )
        self._sampled = explores and self.config.random_warmup and first
        eligible = explores and not self._sampled and (self.config.explorer_in_warmup or not first)
        self._exploring = self._sampled or (
            eligible and self._since_explored + 1 >= self.config.explorer_every
        )
        if eligible:
            self._since_explored = 0 if self._exploring else self._since_explored + 1
        if self._exploring and not self._sampled and self._explorer_would_overrun():
            self._exploring = False
            self.summary.explorer_skipped += 1
        if self.explorer is not None and not self.config.contextual_explore:
            self._explore_share = self._evolved_share() if self._exploring else self.config.explore
        # The explorer first: what it cannot fill (all it found was measured), the descent does.
        explored = []
        self._ranked = self._reused = False
        self._last_explorer_s = 0.0
        if self._exploring:
            n = self._explore_count(count)
            found = self._random_programs(n) if self._sampled else self._evolved_programs(n)
            explored = self._unmeasured(found, n)
            # Handed over now: a later batch that reuses the evolution takes the rest (programs
            # outside the modelled sketches are not in ``measured`` to be filtered there).
            handed = {id(candidate) for candidate, _, _ in explored}
            self._evolved = [c for c in self._evolved if id(c) not in handed]
        taken = {(k, decision_key(d)) for _, k, d in explored if d is not None}
        # In place of the descent's picks, never beside them (a batch cut short by the trial
        # budget, ``--trials``, has no room for more), and at most a quarter of them: the
        # share measured at the CLI's batch of 25 (3 of the descent's 13), which a small
        # batch would otherwise give over to variants (3 of ``./run``'s 4).
        places = count - len(explored)
        room = min(self.config.structural_variants, places, max(1, places // 4))
        variants = [] if first else self._variants(room, taken)
        taken |= {(k, decision_key(d)) for k, d, _ in variants}
        self._structural = len(variants)
        self._picked_ranker, self._reranked = [], False
        picks = self._search(count - len(explored) - len(variants), exclude=taken) + variants
        self.session.refund(count - len(picks) - len(explored))
        self._last_search_s = time.perf_counter() - start
        if not picks and not explored:
            return None
        args_info = ms.arg_info.ArgInfo.from_prim_func(self.context.mod["main"])
        self._pending = [(k, d) for k, d, _ in picks] + [(k, d) for _, k, d in explored]
        self._pending_scores = [score for _, _, score in picks] + [math.nan] * len(explored)
        # The descent's picks come first in ``picks``, then the variants (not ranked).
        self._pending_ranker = self._picked_ranker + [math.nan] * (len(variants) + len(explored))
        self._explored = len(explored)
        self._handed_over = time.perf_counter()
        self.batches += 1
        return [
            ms.MeasureCandidate(self.sketches[k].replay(d).schedule, args_info) for k, d, _ in picks
        ] + [candidate for candidate, _, _ in explored]

    def _variants(self, count: int, exclude: set) -> list[tuple[int, dict, float]]:
        """Up to ``count`` unmeasured structural variants of the task's fastest measured
        programs (``structural_variants``), the best-scored first, with their scores."""
        if self.structural is None or count <= 0:
            return []
        gate = self.config.one_thread_below_us
        found: dict[tuple, tuple[int, dict]] = {}
        for seconds, k, decisions in self._fastest(STRUCTURAL_ELITES):
            one_thread = gate <= 0 or seconds * 1e6 < gate
            for variant in self.structural.variants(k, self.sketches[k], decisions, one_thread):
                key = (k, decision_key(variant))
                if key not in self.measured and key not in exclude:
                    found.setdefault(key, (k, variant))
        scored = []
        for k, variant in found.values():
            feats = self.sketches[k].features_at(variant, "smooth", refit=False)
            if feats is not None and torch.isfinite(feats).all():
                scored.append((k, variant, feats.detach().to(torch.float32)))
        if not scored:
            return []
        with torch.no_grad():
            scores = self._acquire([f for _, _, f in scored]).numpy()
        order = np.argsort(-np.nan_to_num(scores, nan=-np.inf), kind="stable")[:count]
        return [(scored[i][0], scored[i][1], float(scores[i])) for i in order]

    def _evolved_share(self) -> float:
        """The explorer's share of a batch it fills: ``evolved``, or with ``split_by_wins`` how
        often its programs have beaten the descent's in this run so far (a task's
        random first batch keeps ``evolved``: those draws are not the explorer's)."""
        cfg = self.config
        pairs = self.session.explorer_pairs
        if not cfg.split_by_wins or self._sampled or pairs == 0:
            return cfg.evolved
        low, high = cfg.split_bounds
        return min(high, max(low, self.session.explorer_wins / pairs))

    def _explorer_would_overrun(self) -> bool:
        """Whether what is left of the time budget is shorter than the run's latest evolution
        and batch measurement together. The task scheduler starts a batch if the task's last
        one would still end in time, and a task whose last batch was its first (random
        draws) had no evolution in it: on the search benchmark's mbconv_se a late round's
        evolution took 24-41 s, and the run overshot 480 s by 6.4%. The descent alone takes
        1-2 s."""
        session = self.session
        reuse = self._can_reuse(self._explore_count(self.per_iter))
        evolution = 0.0 if reuse else session.explorer_s
        return session.time_left() < evolution + session.batch_s

    def _evolved_programs(self, count: int) -> list[Any]:
        """The explorer's candidates of this round (it makes as many as it was sized for)."""
        if count <= 0:
            return []
        self._reused = self._can_reuse(count)
        if self._reused:
            self._evolved_uses += 1
            return self._evolved
        session, cfg = self.session, self.config
        if session.explorer_population and session.explorer_population != self._population:
            self._build_explorer(session.explorer_population)
        start = time.perf_counter()
        found = list(self.explorer.generate_measure_candidates() or [])
        end = time.perf_counter()
        self._evolved, self._evolved_uses = found, 1
        session.explorer_s = self._last_explorer_s = end - start
        if cfg.explorer_time_share > 0:
            session.evolved(start, end)
            session.explorer_population = resized_population(
                self._population, session.explorer_duty(), cfg.explorer_time_share,
                cfg.explorer_population,
            )  # fmt: skip
        return found

    def _can_reuse(self, count: int) -> bool:
        """Whether the last evolution can fill this batch's explorer share of ``count``
        (``batches_per_evolution``): it has filled fewer batches than that, and at least half
        of ``count`` of its programs are still unmeasured (the descent fills the rest). Not
        all: ``EvolutionarySearch`` drops a pick it made before without drawing another, and
        its picks may include programs the descent has measured since, so an evolution sized
        for two shares seldom leaves a whole second one (a first run on squeeze_fire reused
        once in 11 chances when it had to)."""
        return (
            0 < self._evolved_uses < self.config.batches_per_evolution
            and 2 * len(self._unmeasured(self._evolved, count)) >= count
        )

    def _random_programs(self, count: int) -> list[Any]:
        """``count`` programs of the task's design spaces, every decision drawn at random
        (``random_warmup``), by MetaSchedule's ``ReplayTrace`` used once; with
        ``ranked_warmup`` and a trained ranker, the best ``count`` of more such draws."""
        if count <= 0:
            return []
        drawn = count
        if (
            self.config.ranked_warmup > count
            and self.ranker is not None
            and self.session.measured >= RANKER_TRAINED_AT
        ):
            drawn, self._ranked = self.config.ranked_warmup, True
        sampler = ms.search_strategy.ReplayTrace()
        sampler._initialize_with_tune_context(self.context)
        sampler.pre_tuning(drawn, drawn, self._design_spaces)
        try:
            programs = list(sampler.generate_measure_candidates() or [])
        finally:
            sampler.post_tuning()
        if not self._ranked or len(programs) <= count:
            return programs
        scores = np.asarray(self.ranker.predict(self.context, programs), dtype=float)
        # Unmeasured programs are picked in this order; the rest stay as fallbacks.
        return [programs[i] for i in np.argsort(-scores, kind="stable")]

    def _unmeasured(self, candidates: list[Any], count: int) -> list[tuple[Any, int, dict | None]]:
        """Up to ``count`` of ``candidates``, each with its sketch and decisions where a
        modelled sketch matches, none already measured."""
        if count <= 0:
            return []
        found, taken = [], set()
        for candidate in candidates:
            k, decisions = self._sketch_of(candidate.sch.trace)
            key = (k, decision_key(decisions)) if decisions is not None else None
            if key is not None and (key in taken or key in self.measured):
                continue
            if key is not None:
                taken.add(key)
            found.append((candidate, k, decisions))
            if len(found) == count:
                break
        return found

    def notify_runner_results(self, measure_candidates, results) -> None:
        self.session.measured += len(measure_candidates)
        if self.fallback is not None:
            self.fallback.notify_runner_results(measure_candidates, results)
            return
        measure_s = time.perf_counter() - self._handed_over
        self.session.batch_s = measure_s
        self.remaining -= len(measure_candidates)
        split = len(measure_candidates) - self._explored  # the descent's picks come first
        if self._explored and not self._sampled:
            self.explorer.notify_runner_results(measure_candidates[split:], results[split:])
        median_s = [result_seconds(r) for r in results]  # inf where it failed
        if self.config.split_by_wins and self._explored and not self._sampled:
            self.session.compare_halves(median_s[:split], median_s[split:])
        programs, latencies, predicted, measured = [], [], [], []
        by_ranker, ranker_measured = [], []
        for (k, decisions), score, ranked, secs in zip(
            self._pending, self._pending_scores, self._pending_ranker, median_s, strict=False
        ):
            if decisions is None:  # an explorer's program outside the modelled sketches
                continue
            self.measured.add((k, decision_key(decisions)))
            if math.isfinite(secs):
                if math.isfinite(score):  # the explorer's picks were not scored by the MLP
                    predicted.append(score)
                    measured.append(secs)
                if math.isfinite(ranked):
                    by_ranker.append(ranked)
                    ranker_measured.append(secs)
                self.history.append((secs, k, decisions))
                feats = self.sketches[k].features_at(decisions, "smooth", refit=False)
                if feats is not None and torch.isfinite(feats).all():
                    programs.append(feats.detach().to(torch.float32))
                    latencies.append(secs)
        # Scored before fine-tuning on this batch: how well each model predicted it.
        rho = batch_spearman(predicted, measured)
        ranker_rho = batch_spearman(by_ranker, ranker_measured)
        task = str(self.context.task_name)
        loss = self.cost_model.observe(task, programs, latencies)
        variants_s = median_s[split - self._structural : split]  # the descent's picks end so
        self.session.searched(
            task,
            SearchRound(
                predicted_best=self._last_predicted,
                measured_best_us=1e6 * min(latencies, default=math.inf),
                search_s=self._last_search_s,
                descent_s=self._last_descent_s,
                explorer_s=self._last_explorer_s,
                measure_s=measure_s,
                prediction_spearman=rho,
                ranker_spearman=ranker_rho,
                reranked=self._reranked,
                finetune_loss=loss,
                dropped_seeds=self.summary.nan_seeds,
                evolved=self._explored,
                structural=self._structural,
                explorer_population=(
                    self._population
                    if self._explored and not (self._sampled or self._reused)
                    else 0
                ),
                reused=self._reused,
                sampled=self._sampled,
                ranked=self._ranked,
                explore_share=self._explore_share,
                mean_sigma=self._mean_sigma,
                dropped_members=self._dropped_members,
                descent_best_us=1e6 * min(median_s[:split], default=math.inf),
                evolved_best_us=1e6 * min(median_s[split:], default=math.inf),
                structural_best_us=1e6 * min(variants_s, default=math.inf),
            ),
        )

    def clone(self) -> GradientSearch:
        return GradientSearch(self.cost_model, self.config, self.session)

    # -- Algorithm 1 ---------------------------------------------------------------------------
    def _load_measured(self, database: Any) -> None:
        """Programs already in the database for this workload: never measured twice (resume),
        the fastest of them seed the descent (``elite``), and they are the cost model's first
        online data for this task: a resumed run's, or the schedules a warm start transferred
        from another model (``gradtune.transfer``)."""
        if not database.has_workload(self.context.mod):
            return
        workload = database.commit_workload(self.context.mod)
        programs, latencies = [], []
        for record in database.get_top_k(workload, 100000):
            k, decisions = self._sketch_of(record.trace)
            if decisions is None:
                continue
            self.measured.add((k, decision_key(decisions)))
            median_s = median_seconds(record.run_secs)
            if math.isfinite(median_s):
                self.history.append((median_s, k, decisions))
                if len(programs) < self.config.database_online:  # the fastest first
                    feats = self.sketches[k].features_at(decisions, "smooth", refit=False)
                    if feats is not None and torch.isfinite(feats).all():
                        programs.append(feats.detach().to(torch.float32))
                        latencies.append(median_s)
        if programs:
            self.cost_model.observe(str(self.context.task_name), programs, latencies)

    def _sketch_of(self, trace: Any) -> tuple[int, dict | None]:
        """Which modelled sketch ``trace`` instantiates, and its decisions in that sketch's
        format. Sketches can share every sampling instruction and differ only in a compute
        location or an inlined block, so the whole instruction text decides, not the kinds."""
        for k, sym in enumerate(self.sketches):
            n, signature = self.signatures[k]
            if len(trace.insts) < n or trace_signature(trace, n) != signature:
                continue
            decisions = _decisions_of(sym, trace)
            if decisions is not None:
                return k, decisions
        # MetaSchedule's evolutionary search hands over simplified traces: compare those.
        simple = simple_signature(trace)
        for k, sym in enumerate(self.sketches):
            if self.simple_signatures[k] == simple:
                decisions = _decisions_of(sym, trace)
                if decisions is not None:
                    return k, decisions
        return -1, None

    def _seeds(self, k: int, sym: SymbolicSketch, randoms: int, elites: list[dict]) -> np.ndarray:
        """Starting points in sketch ``k``: measured elites with a little jitter (so Adam does
        not start on a point it may not measure again), then random points of the region."""
        points = [
            sym.variables.encode(d) + self.rng.uniform(-0.3, 0.3, sym.variables.dim) for d in elites
        ]
        points += [sym.variables.random_point(self.rng) for _ in range(randoms)]
        return np.stack(points)

    def _fastest(self, count: int) -> list[tuple[float, int, dict]]:
        """The ``count`` fastest distinct measured programs: (seconds, sketch, decisions)."""
        chosen: dict[tuple, tuple[float, int, dict]] = {}
        for seconds, k, decisions in sorted(self.history, key=lambda h: h[0]):
            if len(chosen) >= count:
                break
            chosen.setdefault((k, decision_key(decisions)), (seconds, k, decisions))
        return list(chosen.values())

    def _elites(self, count: int) -> dict[int, list[dict]]:
        """The ``count`` fastest distinct measured programs, grouped by sketch."""
        chosen: dict[int, list[dict]] = {}
        for _, k, decisions in self._fastest(count):
            chosen.setdefault(k, []).append(decisions)
        return chosen

    def _search(self, count: int, exclude: set | None = None) -> list[tuple[int, dict, float]]:
        """The descent's ``count`` picks, none measured or in ``exclude`` (sketch, decision key)."""
        cfg = self.config
        start = time.perf_counter()
        # (sketch index, decision key) → (sketch index, decisions, seed id): the same decisions
        # in two sketches are two different programs.
        candidates: dict[tuple, tuple[int, dict, int]] = {}
        share = cfg.elite
        if self.batches == 0 and self.history:  # the database's programs (resume, warm start)
            share = max(share, cfg.warm_elite)
        elites = self._elites(int(round(share * cfg.seeds)))
        randoms = cfg.seeds - sum(len(e) for e in elites.values())
        random_per_sketch = max(1, math.ceil(randoms / len(self.sketches)))
        seed_id = 0
        descents = []
        for k, sym in enumerate(self.sketches):
            points = self._seeds(k, sym, random_per_sketch, elites.get(k, []))
            ids = range(seed_id, seed_id + len(points))
            seed_id += len(points)
            x = torch.tensor(points, requires_grad=True)
            alive = torch.ones(len(points), dtype=torch.bool)
            descents.append(_Descent(k, sym, x, torch.optim.Adam([x], lr=cfg.lr), alive, ids))
        # Every sketch steps together, so that the new points of a step, whichever sketch
        # they are in, are applied at once on the probe threads (``replay_together``); each
        # sketch's descent is the one it would be alone.
        for step in range(cfg.steps):
            active = [d for d in descents if d.active]
            if not active:
                break
            replay_together(
                [(d.sym, [d.sym.variables.round(r) for r in d.x.detach().numpy()]) for d in active]
            )
            for d in active:
                self._step(d, step, candidates)
        skip = self.measured | (exclude or set())
        fresh = [c for k, c in candidates.items() if k not in skip]
        self._last_descent_s = time.perf_counter() - start
        return self._pick(fresh, count)

    def _step(self, d: _Descent, step: int, candidates: dict[tuple, tuple[int, dict, int]]) -> None:
        """One Adam step of sketch ``d.k``'s seeds; every point they round to is a candidate."""
        cfg, sym, x = self.config, d.sym, d.x
        if step == int(cfg.decay_at * cfg.steps):
            for group in d.optim.param_groups:
                group["lr"] = cfg.lr * 0.2
        for row, sid in zip(x.detach().numpy(), d.ids, strict=True):
            if d.alive[sid - d.ids.start]:
                decisions = sym.variables.round(row)
                candidates.setdefault((d.k, decision_key(decisions)), (d.k, decisions, sid))
        feats = sym.features(x, "smooth", refit=False)
        valid = [i for i, f in enumerate(feats) if f is not None and d.alive[i]]
        if not valid:
            d.active = False
            return
        scores = self._acquire([feats[i] for i in valid])
        objective = -scores.sum() + cfg.penalty_weight * sym.penalties(x)[valid].sum()
        d.optim.zero_grad()
        objective.backward()
        bad = ~torch.isfinite(x.grad).all(1)
        if bad.any():
            self.summary.nan_seeds += int((bad & d.alive).sum())
            d.alive &= ~bad
            x.grad[bad] = 0.0
        d.optim.step()

    def _pick(self, fresh: list, count: int) -> list[tuple[int, dict, float]]:
        """Re-score every rounded candidate at its integer point; best first, plus exploration."""
        by_sketch: dict[int, list[tuple[dict, int, Any]]] = {}
        for k, decisions, sid in fresh:
            probe = self.sketches[k].replay(decisions)
            if probe is None or not probe.valid:  # rejected by a postprocessor or GPU limits
                continue
            by_sketch.setdefault(k, []).append((decisions, sid, probe))
        scored = []
        for k, entries in by_sketch.items():
            sym = self.sketches[k]
            # One pass over all of a sketch's candidates (their cases compiled together) rather
            # than one evaluation per candidate: integer points encode and round back exactly.
            points = torch.tensor(np.stack([sym.variables.encode(d) for d, _, _ in entries]))
            with torch.no_grad():
                feats = sym.features(points, "smooth", refit=False)
            for (d, sid, probe), f in zip(entries, feats, strict=True):
                if f is not None and torch.isfinite(f).all():
                    scored.append((k, d, f.to(torch.float32), sid, probe))
        if not scored:
            return []
        with torch.no_grad():
            scores = self._acquire([c[2] for c in scored]).numpy()
        finite = np.isfinite(scores)
        if not finite.all():
            # A prediction that is NaN/inf says nothing: drop it (counted), keep the rest.
            self.summary.nan_seeds += int((~finite).sum())
            scored = [c for c, ok in zip(scored, finite, strict=True) if ok]
            scores = scores[finite]
            if not scored:
                return []
        w = self.config.ranker_blend
        # Only when blending: the ranker's features cost ~ms per candidate, every round.
        ranker = self._ranker_scores([c[4] for c in scored]) if w > 0 else None
        if ranker is not None and len(scored) > count:
            blended = (1 - w) * rank_share(scores) + w * rank_share(ranker)
            order = list(np.argsort(-blended, kind="stable"))
            self._reranked = True
        else:
            order = list(np.argsort(-scores))
        if self.config.per_seed_first:
            firsts, seen = [], set()
            for i in order:
                if scored[i][3] not in seen:
                    seen.add(scored[i][3])
                    firsts.append(i)
            first = set(firsts)
            order = firsts + [i for i in order if i not in first]
        # With the explorer on, the explore share is its candidates, already set aside.
        explore = 0 if self._exploring else min(len(order), self._explore_count(count))
        exploit = order[: count - explore]
        rest = order[count - explore :]
        chosen = exploit + list(self.rng.permutation(rest)[:explore]) if rest else exploit
        self._last_predicted = float(scores.max())
        self._picked_ranker = [math.nan if ranker is None else float(ranker[i]) for i in chosen]
        return [(scored[i][0], scored[i][1], float(scores[i])) for i in chosen]

    def _ranker_scores(self, probes: list[Any]) -> np.ndarray | None:
        """The task scheduler's cost model's scores of these replayed programs (higher =
        faster), once it has seen ``RANKER_TRAINED_AT`` programs; None before, without one, or
        where any score is not finite."""
        if self.ranker is None or self.session.measured < RANKER_TRAINED_AT or not probes:
            return None
        args_info = ms.arg_info.ArgInfo.from_prim_func(self.context.mod["main"])
        candidates = [ms.MeasureCandidate(p.schedule, args_info) for p in probes]
        scores = np.asarray(self.ranker.predict(self.context, candidates), dtype=float)
        return scores if np.isfinite(scores).all() else None

    # -- AdaTune's acquisition (acquisition="ei", contextual_explore) ---------------------------
    def _acquire(self, programs: list[torch.Tensor]) -> torch.Tensor:
        """What the descent climbs and the picks are ranked by: the MLP's score, or log EI of
        the ensemble over the incumbent; differentiable, NaN where nothing finite is known."""
        if self._scale is None:
            return self.cost_model.model.score(programs)
        mu, sigma, dropped = self._scale.mu_sigma(self.cost_model.member_scores(programs))
        self._dropped_members += dropped
        self.summary.dropped_members += dropped
        return log_expected_improvement(mu, sigma, self._incumbent)

    def _calibrate(self, samples: int = 64) -> None:
        """The round's scale, incumbent and explore share, from the ensemble's scores of
        ``samples`` random programs spread over the modelled sketches (AdaTune draws its ε
        from random points too)."""
        per_sketch = max(2, math.ceil(samples / len(self.sketches)))
        programs = []
        for sym in self.sketches:
            points = np.stack([sym.variables.random_point(self.rng) for _ in range(per_sketch)])
            with torch.no_grad():
                feats = sym.features(torch.tensor(points), "smooth", refit=False)
            programs += [
                f.to(torch.float32) for f in feats if f is not None and torch.isfinite(f).all()
            ]
        if len(programs) < 2:  # nothing to standardize on: this round scores as Felix does
            self._scale = None
            return
        with torch.no_grad():
            raw = self.cost_model.member_scores(programs)
            scale = Scale.fit(raw)
            mu, sigma, _ = scale.mu_sigma(raw)
        self._mean_sigma = float(sigma[torch.isfinite(sigma)].mean())
        # Without EI the ensemble only sets the explore share: the score still descends, and
        # there is no incumbent to compare with.
        self._scale = scale if self.config.acquisition == "ei" else None
        if self._scale is not None:
            best = self._best_measured()
            if best is not None:
                with torch.no_grad():
                    incumbent, _, _ = scale.mu_sigma(self.cost_model.member_scores([best]))
                self._incumbent = float(incumbent[0])
            if best is None or not math.isfinite(self._incumbent):
                finite = mu[torch.isfinite(mu)]
                self._incumbent = float(finite.max()) if len(finite) else 0.0
        if self.config.contextual_explore:
            self._explore_share = contextual_epsilon(mu, sigma, self.config.explore_bounds)

    def _best_measured(self) -> torch.Tensor | None:
        """Features of the task's fastest measured program the symbolic layer models."""
        for _, k, decisions in sorted(self.history, key=lambda h: h[0]):
            feats = self.sketches[k].features_at(decisions, "smooth", refit=False)
            if feats is not None and torch.isfinite(feats).all():
                return feats.detach().to(torch.float32)
        return None


class _Descent:
    """One sketch's seeds in a round's descent: their points, optimizer and which still move."""

    def __init__(self, k: int, sym: SymbolicSketch, x: torch.Tensor, optim: Any, alive: Any,
                 ids: range) -> None:  # fmt: skip
        self.k, self.sym, self.x, self.optim, self.alive, self.ids = k, sym, x, optim, alive, ids
        self.active = True


def batch_spearman(scores: list[float], seconds: list[float]) -> float:
    """How well ``scores`` (higher = predicted faster) ranked a batch's measured ``seconds``;
    NaN below 3 points, since two points always correlate ±1, which says nothing."""
    if len(scores) < 3:
        return math.nan
    return spearman(np.asarray(scores), -np.asarray(seconds))


def rank_share(scores: np.ndarray) -> np.ndarray:
    """Each score's rank among ``scores`` as a share in [0, 1]: 1 for the highest, 0 for the
    lowest, ties the mean of their places (so two models' orders can be averaged)."""
    if len(scores) < 2:
        return np.ones(len(scores))
    return ranks(np.asarray(scores, dtype=float)) / (len(scores) - 1.0)


def trace_signature(trace: Any, length: int) -> str:
    """The first ``length`` instructions of ``trace`` as text, without sampled decisions: what
    tells two sketches of one task apart (a measured program's trace is its sketch's
    instructions followed by the postprocessors')."""
    from tvm.s_tir.schedule import Trace

    return str(Trace(list(trace.insts[:length]), {}).as_python())


def simple_signature(trace: Any) -> str:
    """``trace`` simplified (instructions whose results go unused and the postprocessors'
    dropped) as text without decisions: the same for a sketch and every program sampled from
    it, however much of the sketch's bookkeeping a program's trace kept."""
    simple = trace.simplified(remove_postproc=True)
    return trace_signature(simple, len(simple.insts))


def _decisions_of(sym: SymbolicSketch, trace: Any) -> dict | None:
    """A measured trace's decisions in ``sym``'s format, if the trace is of this sketch."""
    insts = sampling_insts_of(trace)
    mine = sym.variables.sampling_insts
    if [i.kind.name for i in insts] != [i.kind.name for i in mine]:
        return None
    out = {}
    for var in sym.variables.variables:
        value = trace.decisions.get(insts[var.index])
        if value is None:
            return None
        out[var.index] = [int(v) for v in value] if hasattr(var, "extent") else int(value)
    return out
