"""Felix's gradient search (Algorithm 1) as a MetaSchedule ``PySearchStrategy``.

Per round of the task it tunes: seeds are drawn inside each sketch's constraint region; Adam
descends O(x) = −score(features(x)) + λ · penalties(x) for a few dozen steps (the features are
the symbolic schedule's smooth formulas, the score the Felix MLP); every iterate is rounded to
valid decisions, duplicates and already-measured ones dropped, the rest re-scored at their
integer points, and the best ``num_trials_per_iter`` (minus a small random exploration share)
go to MetaSchedule's builder and runner. Measured results fine-tune the cost model online.
Across tasks MetaSchedule's gradient task scheduler picks which task gets the next round
(Felix Algorithm 2), and results land in the JSONDatabase like any other strategy's.

A task none of whose sketches the symbolic layer can model is searched by MetaSchedule's
EvolutionarySearch instead (logged and counted in ``SearchStats``), never aborting the run.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from gradtune.costmodel.online import OnlineCostModel
from gradtune.stop import StopSignal
from gradtune.symbolic.sketch import SymbolicSketch, decision_key
from gradtune.symbolic.variables import sampling_insts_of
from gradtune.target import is_gpu as target_is_gpu

log = logging.getLogger("gradtune.search")


@dataclass
class GradientConfig:
    """Felix used nSeeds 8, nSteps 200, nMeasure 16 on GPUs. When these were chosen one Adam
    step over a sketch's seeds cost ~150 ms on this CPU (autograd through the feature formulas,
    plus a TVM replay for every new case), while a round's build + RPC run of 8 candidates is
    ~8 s; 200 steps would have tripled a round. 16 steps of lr 0.5 (Felix's ×0.2 decay at 30%)
    move a variable by up to ~3 in log2 space (a factor of 9) from its seed, and the seeds are
    spread over the whole region. nMeasure is the task scheduler's batch (``trials_per_round``).
    Since the compiled evaluator a step costs a few ms plus the replays of new cases (a whole
    round's search ~2–3.5 s on the benchmark models): more steps are affordable now, untested."""

    seeds: int = 8
    steps: int = 16
    lr: float = 0.5
    decay_at: float = 0.3
    penalty_weight: float = 10.0
    explore: float = 0.125  # share of each batch measured at random, as a guard on the model


@dataclass
class RoundLog:
    task: str
    measured: int
    predicted_best: float  # the model's score of its favourite pick (higher = faster)
    measured_best_us: float
    search_s: float
    descent_s: float
    measure_s: float  # build + RPC run of the batch (from hand-over to results)
    prediction_spearman: float  # predicted scores vs measured speed of this batch
    finetune_loss: float
    dropped_seeds: int


@dataclass
class SearchStats:
    """Shared by every task's strategy in a run, for reports and MLflow."""

    rounds: list[RoundLog] = field(default_factory=list)
    fallback_tasks: list[str] = field(default_factory=list)
    nan_seeds: int = 0


@derived_object
class GradientSearch(ms.search_strategy.PySearchStrategy):
    def __init__(
        self,
        cost_model: OnlineCostModel | None = None,
        config: GradientConfig | None = None,
        stats: SearchStats | None = None,
        signal: StopSignal | None = None,
    ) -> None:
        self.cost_model = cost_model or OnlineCostModel.default()
        self.config = config or GradientConfig()
        self.stats = stats if stats is not None else SearchStats()
        self.signal = signal if signal is not None else StopSignal()
        self.context: Any = None
        self.sketches: list[SymbolicSketch] = []
        self.fallback: Any = None
        self.measured: set = set()
        self.remaining = 0
        self.per_iter = 0
        self.rng = np.random.default_rng(0)
        self._pending: list[tuple[SymbolicSketch, dict]] = []
        self._last_search_s = 0.0
        self._last_descent_s = 0.0
        self._last_predicted = 0.0
        self._pending_scores: list[float] = []
        self._handed_over = 0.0

    # -- MetaSchedule interface ---------------------------------------------------------------
    def _initialize_with_tune_context(self, context: Any) -> None:
        self.context = context
        self.rng = np.random.default_rng(int(context.rand_state) & 0xFFFFFFFF)

    def pre_tuning(self, max_trials, num_trials_per_iter, design_spaces, database=None,
                   cost_model=None) -> None:  # fmt: skip
        self.remaining = int(max_trials)
        self.per_iter = int(num_trials_per_iter)
        mod = self.context.mod
        postprocs = list(self.context.space_generator.postprocs)
        is_gpu = target_is_gpu(self.context.target)
        self.sketches = []
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
        if database is not None:
            self._load_measured(database)
        if not self.sketches:
            self.stats.fallback_tasks.append(str(self.context.task_name))
            log.warning("%s: no sketch can be modelled; evolutionary search instead",
                        self.context.task_name)  # fmt: skip
            self.fallback = ms.search_strategy.EvolutionarySearch()
            self.fallback._initialize_with_tune_context(self.context)
            self.fallback.pre_tuning(max_trials, num_trials_per_iter, design_spaces, database,
                                     cost_model)  # fmt: skip

    def post_tuning(self) -> None:
        if self.fallback is not None:
            self.fallback.post_tuning()

    def generate_measure_candidates(self) -> list[Any] | None:
        if self.signal.stopped:
            return None
        if self.fallback is not None:
            return self.fallback.generate_measure_candidates()
        if self.remaining <= 0:
            return None
        start = time.perf_counter()
        picks = self._search(min(self.per_iter, self.remaining))
        self._last_search_s = time.perf_counter() - start
        if not picks:
            return None
        args_info = ms.arg_info.ArgInfo.from_prim_func(self.context.mod["main"])
        self._pending = [(sym, d) for sym, d, _ in picks]
        self._pending_scores = [score for _, _, score in picks]
        self._handed_over = time.perf_counter()
        return [ms.MeasureCandidate(sym.replay(d).schedule, args_info) for sym, d, _ in picks]

    def notify_runner_results(self, measure_candidates, results) -> None:
        if self.fallback is not None:
            self.fallback.notify_runner_results(measure_candidates, results)
            return
        measure_s = time.perf_counter() - self._handed_over
        self.remaining -= len(measure_candidates)
        programs, latencies, predicted, measured = [], [], [], []
        for (sym, decisions), score, result in zip(
            self._pending, self._pending_scores, results, strict=False
        ):
            self.measured.add(decision_key(decisions))
            secs = [float(s) for s in (result.run_secs or [])]
            if result.error_msg is None and secs:
                predicted.append(score)
                measured.append(float(np.median(secs)))
                feats = sym.features_at(decisions, "smooth", refit=False)
                if feats is not None and torch.isfinite(feats).all():
                    programs.append(feats.detach().to(torch.float32))
                    latencies.append(float(np.median(secs)))
        # Scored before fine-tuning on this batch: how well the model predicted it.
        spearman = _spearman(np.asarray(predicted), -np.asarray(measured))
        loss = self.cost_model.observe(str(self.context.task_name), programs, latencies)
        self.stats.rounds.append(
            RoundLog(
                task=str(self.context.task_name),
                measured=len(measure_candidates),
                predicted_best=self._last_predicted,
                measured_best_us=1e6 * min(latencies, default=math.inf),
                search_s=self._last_search_s,
                descent_s=self._last_descent_s,
                measure_s=measure_s,
                prediction_spearman=spearman,
                finetune_loss=loss,
                dropped_seeds=self.stats.nan_seeds,
            )
        )

    def clone(self) -> GradientSearch:
        return GradientSearch(self.cost_model, self.config, self.stats, self.signal)

    # -- Algorithm 1 ---------------------------------------------------------------------------
    def _load_measured(self, database: Any) -> None:
        """Decisions already in the database for this workload: never measured twice (resume)."""
        if not database.has_workload(self.context.mod):
            return
        workload = database.commit_workload(self.context.mod)
        for record in database.get_top_k(workload, 100000):
            for sym in self.sketches:
                decisions = _decisions_of(sym, record.trace)
                if decisions is not None:
                    self.measured.add(decision_key(decisions))
                    break

    def _search(self, count: int) -> list[tuple[SymbolicSketch, dict, float]]:
        cfg = self.config
        model = self.cost_model.model
        start = time.perf_counter()
        candidates: dict[tuple, tuple[SymbolicSketch, dict]] = {}
        seeds_per_sketch = max(1, math.ceil(cfg.seeds / len(self.sketches)))
        for sym in self.sketches:
            seeds = range(seeds_per_sketch)
            points = np.stack([sym.variables.random_point(self.rng) for _ in seeds])
            x = torch.tensor(points, requires_grad=True)
            optim = torch.optim.Adam([x], lr=cfg.lr)
            alive = torch.ones(len(points), dtype=torch.bool)
            for step in range(cfg.steps):
                if step == int(cfg.decay_at * cfg.steps):
                    for group in optim.param_groups:
                        group["lr"] = cfg.lr * 0.2
                for row in x.detach().numpy()[alive.numpy()]:
                    decisions = sym.variables.round(row)
                    candidates.setdefault(decision_key(decisions), (sym, decisions))
                feats = sym.features(x, "smooth", refit=False)
                valid = [i for i, f in enumerate(feats) if f is not None and alive[i]]
                if not valid:
                    break
                scores = model.score([feats[i] for i in valid])
                objective = -scores.sum() + cfg.penalty_weight * sym.penalties(x)[valid].sum()
                optim.zero_grad()
                objective.backward()
                bad = ~torch.isfinite(x.grad).all(1)
                if bad.any():
                    self.stats.nan_seeds += int((bad & alive).sum())
                    alive &= ~bad
                    x.grad[bad] = 0.0
                optim.step()
        fresh = [c for k, c in candidates.items() if k not in self.measured]
        self._last_descent_s = time.perf_counter() - start
        return self._pick(fresh, count)

    def _pick(self, fresh: list, count: int) -> list[tuple[SymbolicSketch, dict, float]]:
        """Re-score every rounded candidate at its integer point; best first, plus exploration."""
        by_sketch: dict[int, tuple[SymbolicSketch, list[dict]]] = {}
        for sym, decisions in fresh:
            probe = sym.replay(decisions)
            if probe is None or not probe.valid:  # rejected by a postprocessor or GPU limits
                continue
            by_sketch.setdefault(id(sym), (sym, []))[1].append(decisions)
        scored = []
        for sym, decisions in by_sketch.values():
            # One pass over all of a sketch's candidates (their cases compiled together) rather
            # than one evaluation per candidate: integer points encode and round back exactly.
            points = torch.tensor(np.stack([sym.variables.encode(d) for d in decisions]))
            with torch.no_grad():
                feats = sym.features(points, "smooth", refit=False)
            for d, f in zip(decisions, feats, strict=True):
                if f is not None and torch.isfinite(f).all():
                    scored.append((sym, d, f.to(torch.float32)))
        if not scored:
            return []
        with torch.no_grad():
            scores = self.cost_model.model.score([f for _, _, f in scored]).numpy()
        finite = np.isfinite(scores)
        if not finite.all():
            # A prediction that is NaN/inf says nothing: drop it (counted), keep the rest.
            self.stats.nan_seeds += int((~finite).sum())
            scored = [c for c, ok in zip(scored, finite, strict=True) if ok]
            scores = scores[finite]
            if not scored:
                return []
        order = list(np.argsort(-scores))
        explore = min(len(order), int(round(self.config.explore * count)))
        exploit = order[: count - explore]
        rest = order[count - explore :]
        chosen = exploit + list(self.rng.permutation(rest)[:explore]) if rest else exploit
        self._last_predicted = float(scores[order[0]])
        return [(scored[i][0], scored[i][1], float(scores[i])) for i in chosen]


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Rank correlation (NaN for fewer than 3 points or a constant side)."""
    if len(a) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return math.nan
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


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
