"""A symbolic schedule: one MetaSchedule sketch as variables, leaf formulas and cases.

``SymbolicSketch.build`` probes the sketch (``formulas``) so that every leaf of its programs is
a closed form of the decisions. ``features(x, mode)`` is then a torch function of the
continuous point ``x``: the leaves are evaluated from ``x`` (tile factors 2^(Σ exponent · log2
prime), categoricals 2^x − 1), and the program's *case* — which loops exist after unit-loop
removal, fusion for parallelism, vectorization and unrolling, as ``PerStoreFeature`` sees them
— is the one of the rounded point, replayed once in TVM and cached by its decisions (case
boundaries are where TVM's lowering branches: one closed form over a whole sketch leaves a
fifth of the feature cells piecewise, one per case is exact). Within a case the features are smooth
in ``x``; across cases they jump, which is what the rounded candidates are re-scored for.
"""

from __future__ import annotations

import functools
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from gradtune.symbolic.compiled import compiled, evaluate_cases
from gradtune.symbolic.formulas import LeafFormula, fit_leaves
from gradtune.symbolic.gpu import gpu_penalties
from gradtune.symbolic.program import Program, extract_program
from gradtune.symbolic.regions import depths, derive
from gradtune.symbolic.variables import SketchVariables, TileVar


def decision_key(decisions: dict[int, Any]) -> tuple:
    return tuple((i, tuple(v) if isinstance(v, list) else v) for i, v in sorted(decisions.items()))


def _overdetermined(formula: LeafFormula, log_f: np.ndarray, rows: int, margin: int = 2) -> bool:
    """Whether ``rows`` probes pin ``formula`` down: more probes than it has free parameters
    (exponents over the columns that vary, plus coefficient and offset) by ``margin``."""
    if formula.kind in ("const", "cat"):
        return rows >= 1 + margin
    design = np.hstack([log_f, np.ones((log_f.shape[0], 1))])
    rank = int(np.linalg.matrix_rank(design)) + (formula.kind == "affine")
    return rows >= rank + margin


@dataclass
class Probe:
    decisions: dict[int, Any]
    program: Program
    schedule: Any
    valid: bool = True  # TVM's VerifyGPUCode verdict on GPU targets (always True on CPU)


_POOL: list[ThreadPoolExecutor] = []
_POOL_LOCK = threading.Lock()
_THREAD = threading.local()


def _probe_pool() -> ThreadPoolExecutor | None:
    """One pool of probe threads per process, one per core (at most 8); None on one core."""
    threads = min(8, os.cpu_count() or 1)
    if threads < 2:
        return None
    with _POOL_LOCK:
        if not _POOL:
            _POOL.append(ThreadPoolExecutor(threads, thread_name_prefix="gradtune-probe"))
        return _POOL[0]


def _thread_postprocs(postprocs: list[Any]) -> list[Any]:
    """This thread's copies of ``postprocs``: postprocessors may keep state between calls, so
    each thread applies its own, as MetaSchedule's threaded trace application does."""
    copies = _THREAD.__dict__.setdefault("postprocs", {})
    # The original is kept with its copies so that its id cannot be reused by another list.
    entry = copies.get(id(postprocs))
    if entry is None or entry[0] is not postprocs:
        entry = copies[id(postprocs)] = (postprocs, [p.clone() for p in postprocs])
    return entry[1]


def replay_together(requests: list[tuple[SymbolicSketch, list[dict[int, Any]]]]) -> None:
    """``replay`` of every decision of several sketches' batches, the uncached ones of all of
    them applied at once on the probe threads (``SymbolicSketch._threaded_apply``); afterwards
    each is in its sketch's cache, in the order one thread would have put it there."""
    if _probe_pool() is None:
        return
    # Every sketch's jobs are submitted before any is waited for.
    pending = [(sym, sym._submit_uncached(batch, sym._threaded_apply())) for sym, batch in requests]
    for sym, jobs in pending:
        sym._collect(jobs)


@dataclass
class SymbolicSketch:
    mod: Any
    variables: SketchVariables
    postprocs: list[Any]
    is_gpu: bool
    target: Any = None  # for the GPU constraints' limits
    formulas: dict[str, LeafFormula] = field(default_factory=dict)
    unsupported: dict[str, str] = field(default_factory=dict)  # leaf key → why
    probes: int = 0
    local_fits: int = 0  # cases that needed leaves fitted on their own neighbours
    # Decision keys (as applied) of every probe a formula was fitted on, sketch-wide or per
    # case, and the keys no per-case fit may use (a verification's samples).
    fitted_on: set[tuple] = field(default_factory=set)
    held_out: frozenset[tuple] = frozenset()
    _cases: dict[tuple, Probe | None] = field(default_factory=dict)
    # Per case signature: leaf formulas fitted on same-case neighbours (piecewise leaves).
    _case_formulas: dict[str, dict[str, LeafFormula]] = field(default_factory=dict)
    _banks: dict[tuple, dict[str, Any]] = field(default_factory=dict)

    @functools.cached_property
    def _unscheduled(self) -> Any:
        """``mod`` as a schedule with nothing applied, which every probe starts from a copy of.
        Probes on several threads copy it at once: copying only reads it."""
        import tvm

        return tvm.s_tir.Schedule(self.mod)

    # -- the decision columns ---------------------------------------------------------------
    @property
    def n_factors(self) -> int:
        return sum(t.n - 1 for t in self.variables.tiles)

    @functools.cached_property
    def _scales(self) -> list[int]:
        """The categoricals whose candidates are all positive (vector lengths, not unroll
        steps, which include 0): they scale loops like tile factors do — a cooperative fetch
        of ``n`` elements with vector length ``v`` runs ``n / v`` thread iterations — so their
        logs are monomial columns too."""
        return [j for j, c in enumerate(self.variables.categoricals) if min(c.candidates) > 0]

    @property
    def n_columns(self) -> int:
        """Columns a monomial leaf is fitted over: the inner tile factors, then the scales."""
        return self.n_factors + len(self._scales)

    def columns(self, decisions: dict[int, Any]) -> tuple[np.ndarray, np.ndarray]:
        """log monomial columns (``n_columns``,) and categorical values (C,) of integer
        decisions."""
        logs = [math.log(f) for t in self.variables.tiles for f in decisions[t.index][1:]]
        cats = [c.candidates[decisions[c.index]] for c in self.variables.categoricals]
        logs += [math.log(cats[j]) for j in self._scales]
        return np.asarray(logs, dtype=float), np.asarray(cats, dtype=float)

    @functools.cached_property
    def _linear(self) -> dict[str, torch.Tensor]:
        """Everything of ``x`` that is linear in it, as matrices: the log inner tile factors
        (Σ exponent · log prime), the categoricals' positions, and every constraint of the
        region, g(x) = A·x − b ≤ 0 (exponents ≥ 0, each prime's exponents within the extent's,
        log2 innermost factor ≤ log2 max_innermost_factor, categoricals within their candidates).
        One matmul per batch then replaces a loop of small ops per variable, on the search's
        hot path (every Adam step)."""
        dim = self.variables.dim
        log_cols: list[np.ndarray] = []
        cat_idx: list[int] = []
        rows: list[np.ndarray] = []
        bounds: list[float] = []

        def row(entries: dict[int, float], bound: float) -> None:
            a = np.zeros(dim)
            for k, v in entries.items():
                a[k] = v
            rows.append(a)
            bounds.append(bound)

        offset = 0
        for var in self.variables.variables:
            if isinstance(var, TileVar):
                width = len(var.primes)
                index = [[offset + i * width + j for j in range(width)] for i in range(var.n - 1)]
                for factor in index:
                    col = np.zeros(dim)  # an extent-1 tile has no primes: log factor 0
                    col[factor] = [math.log(p) for p in var.primes]
                    log_cols.append(col)
                    for k in factor:
                        row({k: -1.0}, 0.0)
                for j, total in enumerate(var.totals):
                    row({factor[j]: 1.0 for factor in index}, float(total))
                if var.max_innermost > 0 and width:
                    inner = {k: math.log2(p) for k, p in zip(index[-1], var.primes, strict=True)}
                    row(inner, math.log2(var.max_innermost))
            else:
                cat_idx.append(offset)
                row({offset: -1.0}, -math.log2(1 + min(var.candidates)))
                row({offset: 1.0}, math.log2(1 + max(var.candidates)))
            offset += var.size

        def matrix(vectors: list[np.ndarray]) -> torch.Tensor:
            return torch.as_tensor(np.stack(vectors, 1) if vectors else np.zeros((dim, 0)))

        return {
            "log_f": matrix(log_cols),  # (dim, F)
            "cat_idx": torch.as_tensor(cat_idx, dtype=torch.long),
            "a": matrix(rows),  # (dim, constraints)
            "b": torch.as_tensor(bounds, dtype=torch.float64),
        }

    def continuous_columns(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The same columns as differentiable functions of continuous points (batch, dim)."""
        lin = self._linear
        log_f = x @ lin["log_f"].to(x.dtype)
        cats = torch.exp2(x[:, lin["cat_idx"]]) - 1.0
        if self._scales:
            # Off the region a relaxed scale may dip to 0 or below; the penalty pulls it back.
            scales = torch.log(cats[:, self._scales].clamp_min(1e-6))
            log_f = torch.cat([log_f, scales], dim=1)
        return log_f, cats

    # -- probing ------------------------------------------------------------------------------
    def replay(self, decisions: dict[int, Any]) -> Probe | None:
        """Apply integer decisions in TVM (cached): the case program, or None if invalid."""
        key = decision_key(decisions)
        if key not in self._cases:
            self._cases[key] = self._apply(decisions, self.postprocs)
            self.probes += 1
        return self._cases[key]

    def _replay_all(self, batch: list[dict[int, Any]], submit: Any = None) -> list[Probe | None]:
        """``replay`` of every decision of ``batch``; with ``submit`` (decisions → Future of
        the probe), the uncached ones run concurrently: TVM releases the GIL."""
        if submit is None:
            return [self.replay(decisions) for decisions in batch]
        self._collect(self._submit_uncached(batch, submit))
        return [self._cases[decision_key(decisions)] for decisions in batch]

    def _submit_uncached(self, batch: list[dict[int, Any]], submit: Any) -> dict[tuple, Any]:
        """Futures of the probes of ``batch`` not in the cache yet, once per decision key."""
        jobs: dict[tuple, Any] = {}
        for decisions in batch:
            key = decision_key(decisions)
            if key not in self._cases and key not in jobs:
                jobs[key] = submit(decisions)
        return jobs

    def _collect(self, jobs: dict[tuple, Any]) -> None:
        for key, job in jobs.items():  # in the order one thread would have replayed them
            self._cases[key] = job.result()
            self.probes += 1

    def _threaded_apply(self) -> Any:
        """``_replay_all``'s ``submit`` on the process's probe threads (None on one core).

        A descent step rounds each seed to a point, and most are new programs: ~25 ms each
        to apply and extract, of which the trace, the postprocessors and the lowering (about
        half) are TVM's and release the GIL. In a tune on the local fleet nothing else runs
        while the search does (``GradientTaskScheduler``'s ``exclusive``), so the other cores
        are idle then."""
        pool = _probe_pool()
        return None if pool is None else functools.partial(pool.submit, self._apply_on_thread)

    def _apply_on_thread(self, decisions: dict[int, Any]) -> Probe | None:
        return self._apply(decisions, _thread_postprocs(self.postprocs))

    def _apply(self, decisions: dict[int, Any], postprocs: list[Any]) -> Probe | None:
        x = self.variables.encode(decisions)
        # VerifyGPUCode only judges (it never rewrites): run it apart, so that a point GPU
        # limits reject still has a program, features and a penalty to push it back.
        checks = [p for p in postprocs if type(p).__name__ == "VerifyGPUCode"]
        rewrites = [p for p in postprocs if p not in checks]
        sch, applied = self.variables.decode(self.mod, x, rewrites, self._unscheduled)
        if sch is None:
            return None
        valid = all(bool(c.apply(sch)) for c in checks)
        return Probe(applied, extract_program(sch.mod, self.is_gpu), sch, valid)

    def random_decisions(self, rng: np.random.Generator) -> dict[int, Any]:
        """Random decisions inside the constraint region: on GPU, a random point pulled into
        the region by descending the penalties (Felix draws its seeds this way)."""
        x = self.variables.random_point(rng)
        if self.is_gpu and self.target is not None:
            x = self.feasible(torch.tensor(x[None]))[0].numpy()
        return self.variables.round(x)

    def feasible(self, x: torch.Tensor, steps: int = 40, lr: float = 0.3) -> torch.Tensor:
        """Points moved by gradient descent on the penalties until they round validly."""
        x = x.detach().clone().requires_grad_(True)
        optim = torch.optim.Adam([x], lr=lr)
        for _ in range(steps):
            penalty = self.penalties(x)
            if float(penalty.detach().max()) <= 0:
                break
            optim.zero_grad()
            penalty.sum().backward()
            optim.step()
        return x.detach()

    @classmethod
    def build(
        cls,
        mod: Any,
        sketch_trace: Any,
        postprocs: list[Any],
        is_gpu: bool = False,
        rng: np.random.Generator | None = None,
        min_probes: int = 24,
        target: Any = None,
        threaded: bool = True,
    ) -> SymbolicSketch:
        """Variables from the sketch's trace, then leaf formulas fitted on random probes.

        The probes are applied in TVM on the process's probe threads (``threaded``; one per
        core, at most 8), which changes nothing but the time: the same decisions are drawn in
        the same order, and each probe is the same program whichever thread applied it."""
        rng = rng or np.random.default_rng(0)
        sym = cls(mod, SketchVariables.from_trace(sketch_trace), postprocs, is_gpu, target)
        wanted = max(min_probes, 2 * (sym.n_columns + 1) + 4)
        probes = [sym.replay(sym.variables.sketch_decisions())]
        attempts = 0
        submit = sym._threaded_apply() if threaded else None
        while (valid := sum(p is not None for p in probes)) < wanted and attempts < 4 * wanted:
            # As many draws as probes still missing: one thread would make all of them
            # before it could stop, so the draws and their order are as sequential.
            draws = min(wanted - valid, 4 * wanted - attempts)
            batch = [sym.random_decisions(rng) for _ in range(draws)]
            probes += sym._replay_all(batch, submit)
            attempts += draws
        sym.fit([p for p in probes if p is not None])
        return sym

    def fit(self, probes: list[Probe]) -> None:
        self.fitted_on.update(decision_key(probe.decisions) for probe in probes)
        columns = [self.columns(probe.decisions) for probe in probes]
        observed: dict[str, list[int]] = {}  # leaf → the probes (positions) it appears in
        for n, probe in enumerate(probes):
            for key in probe.program.values:
                observed.setdefault(key, []).append(n)
        # Leaves seen in the same probes share one design matrix: fit them together.
        groups: dict[tuple[int, ...], list[str]] = {}
        for key, rows in observed.items():
            groups.setdefault(tuple(rows), []).append(key)
        fitted: dict[str, LeafFormula | None] = {}
        designs: dict[tuple[int, ...], np.ndarray] = {}
        for rows, keys in groups.items():
            log_f = designs[rows] = np.stack([columns[n][0] for n in rows])
            cats = np.stack([columns[n][1] for n in rows])
            values = np.asarray(
                [[probes[n].program.values[key] for key in keys] for n in rows], dtype=float
            ).reshape(len(rows), len(keys))
            fitted.update(zip(keys, fit_leaves(log_f, cats, values), strict=True))
        # _overdetermined depends only on the probes and the formula's kind: once per pair.
        pinned: dict[tuple[tuple[int, ...], str], bool] = {}
        for key, rows in observed.items():
            formula = fitted[key]
            if formula is not None:
                group = (tuple(rows), formula.kind)
                if group not in pinned:
                    pinned[group] = _overdetermined(formula, designs[group[0]], len(rows))
                if not pinned[group]:
                    # Too few probes to tell a closed form from a coincidence: leave the leaf
                    # to the per-case fit.
                    continue
            if formula is None:
                self.unsupported[key] = f"no closed form fits its {len(rows)} probes"
                self.formulas.pop(key, None)
            else:
                self.formulas[key] = formula
                self.unsupported.pop(key, None)

    def neighbours(self, decisions: dict[int, Any], rng: np.random.Generator) -> list:
        """Decisions one prime move away (between two factors of one tile, or a categorical
        step): the probes that share a case with ``decisions`` are most likely among them."""
        out = []
        for var in self.variables.tiles:
            factors = list(decisions[var.index])
            for p in var.primes:
                for src in range(var.n):
                    if factors[src] % p:
                        continue
                    for dst in range(var.n):
                        if dst == src:
                            continue
                        moved = list(factors)
                        moved[src] //= p
                        moved[dst] *= p
                        if var.max_innermost > 0 and moved[-1] > var.max_innermost:
                            continue
                        out.append({**decisions, var.index: moved})
        for var in self.variables.categoricals:
            for choice in range(len(var.candidates)):
                if choice != decisions[var.index]:
                    out.append({**decisions, var.index: choice})
        order = rng.permutation(len(out))
        return [out[i] for i in order]

    def fit_case(self, probe: Probe, rng: np.random.Generator | None = None) -> dict:
        """Leaf formulas for ``probe``'s case, from same-case neighbours only (never from the
        point itself, nor from a ``held_out`` point): a sketch-wide formula is kept where it
        reproduces every neighbour, refitted on the neighbours where it does not (a piecewise
        leaf), and fitted there when the sketch has none."""
        program = probe.program
        signature = program.signature()
        if signature in self._case_formulas:
            return self._case_formulas[signature]
        rng = rng or np.random.default_rng(len(self._case_formulas))
        wanted = self.n_columns + 2
        same: list[Probe] = []  # whole-program case equal
        tried: list[Probe] = []  # every neighbour replayed
        # Held-out points are skipped before they are replayed, and again when TVM applied a
        # neighbour's decisions as a held-out point's.
        seen = {decision_key(probe.decisions), *self.held_out}
        frontier, budget = [probe.decisions], 4 * wanted
        # Breadth-first over one-prime moves: a case that is narrow around the point (few
        # non-unit factors) is reached two moves away.
        while frontier and budget > 0 and len(same) < wanted:
            nxt, reached = [], len(tried)
            for start in frontier:
                for decisions in self.neighbours(start, rng):
                    key = decision_key(decisions)
                    if key in seen or budget <= 0 or len(same) >= wanted:
                        continue
                    seen.add(key)
                    budget -= 1
                    other = self.replay(decisions)
                    if other is None or decision_key(other.decisions) in self.held_out:
                        continue
                    tried.append(other)
                    if other.program.signature() == signature:
                        same.append(other)
                        nxt.append(other.decisions)
            # A point alone in its case: walk on through the other cases, whose probes still
            # pin down the leaves fitted on every neighbour that has them (below).
            frontier = nxt or ([] if same else [o.decisions for o in tried[reached:]])
        self.fitted_on.update(decision_key(o.decisions) for o in tried)
        pools = {}
        for key in program.values:
            if key in program.derived:
                continue  # computed from other leaves (regions.py), never fitted here
            pools[key] = self._pool(key, program, same, tried)
        found, kept = self._refit(pools)
        # A point alone in its case (a unit tile, say) has no neighbours to fit on. Loop
        # extents, strides and index integers depend on the decisions that built their loops,
        # which many differently-cased neighbours share: fit those leaves on every neighbour
        # that has them (an exact fit with a spare probe, or nothing).
        wide = {}
        for key, pool in pools.items():
            if key not in found and key not in kept and key[0] in "LSX":
                others = [o for o in tried if key in o.program.values]
                if len(others) > len(pool):
                    wide[key] = others
        found.update(self._refit(wide)[0])
        local = {key: found[key] for key in program.values if key in found}
        if local:
            self.local_fits += 1
        self._case_formulas[signature] = local
        return local

    def _refit(self, pools: dict[str, list[Probe]]) -> tuple[dict[str, LeafFormula], set[str]]:
        """Formulas for the leaves whose sketch-wide one (if any) misses a probe of their pool,
        and the leaves whose sketch-wide one reproduces it; leaves sharing a pool are fitted
        together."""
        kept: set[str] = set()
        designs: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}
        refits: dict[tuple[int, ...], tuple[list[Probe], list[str]]] = {}
        for key, pool in pools.items():
            if not pool:
                continue
            ident = tuple(id(o) for o in pool)
            if ident not in designs:
                cols = [self.columns(o.decisions) for o in pool]
                designs[ident] = (np.stack([c[0] for c in cols]), np.stack([c[1] for c in cols]))
            log_f, cats = designs[ident]
            formula = self.formulas.get(key)
            if formula is not None:
                values = np.asarray([o.program.values[key] for o in pool], dtype=float)
                got = formula.evaluate(torch.as_tensor(log_f), torch.as_tensor(cats)).numpy()
                if np.allclose(got, values, rtol=1e-9, atol=1e-9):
                    kept.add(key)
                    continue
            refits.setdefault(ident, (pool, []))[1].append(key)
        found: dict[str, LeafFormula] = {}
        for ident, (pool, keys) in refits.items():
            log_f, cats = designs[ident]
            values = np.asarray(
                [[o.program.values[key] for key in keys] for o in pool], dtype=float
            ).reshape(len(pool), len(keys))
            for key, refit in zip(keys, fit_leaves(log_f, cats, values), strict=True):
                if refit is not None and _overdetermined(refit, log_f, len(pool), margin=1):
                    found[key] = refit
        return found, kept

    @staticmethod
    def _pool(key: str, program: Program, same: list[Probe], tried: list[Probe]) -> list[Probe]:
        """The neighbours a leaf can be fitted on: a store's regions and strides depend only on
        that store's own loop nest, so neighbours whose other stores changed shape still count
        (far more of them than whole-program twins); other leaves need the whole case."""
        kind, _, rest = key.partition(":")
        if kind in ("N", "S", "X"):
            store = rest.split(":", 1)[0].rsplit("#", 1)[0]
            mine = program.store_signature(store)
            return [
                o
                for o in tried
                if key in o.program.values and o.program.store_signature(store) == mine
            ]
        return same

    # -- features ---------------------------------------------------------------------------
    def leaves(
        self,
        program: Program,
        log_f: torch.Tensor,
        cats: torch.Tensor,
        point_values: bool = False,
        mode: str = "exact",
    ) -> dict[str, torch.Tensor]:
        """Leaf values from the formulas, all evaluated in one batched op per kind. A leaf with
        no formula is NaN (it poisons, never lies), or with ``point_values`` its value at the
        rounded point (exact there, no gradient) — what the search may use, never verify.
        Derived region leaves are then computed from the others (``regions.derive``)."""
        bank = self._bank(program, point_values)
        batch = log_f.shape[0]
        values = bank["const"].expand(batch, -1).clone()
        if bank["mono_idx"].numel():
            mono = torch.exp(bank["log_coef"] + log_f @ bank["exps"].T) + bank["offset"]
            values[:, bank["mono_idx"]] = mono
        if bank["cat_idx"].numel():
            values[:, bank["cat_idx"]] = cats[:, bank["cat_col"]].to(torch.float64)
        # unbind, not values[:, i]: its backward is one stack, not one (batch, K) scatter per leaf.
        out = dict(zip(bank["keys"], values.unbind(1), strict=True))
        one = torch.ones(batch, dtype=torch.float64)
        for key, derivation, _ in bank["derived"]:
            out[key] = derive(derivation, out.__getitem__, mode, one)
        return out

    def _bank(self, program: Program, point_values: bool) -> dict[str, Any]:
        """The formulas of a case as arrays (cached): evaluating hundreds of leaves one by one
        costs more than the features built from them."""
        cache_key = (program.signature(), point_values, id(program) if point_values else 0)
        if cache_key in self._banks:
            return self._banks[cache_key]
        local = self._case_formulas.get(program.signature(), {})
        keys = list(program.values)
        const = np.full(len(keys), np.nan)
        mono_idx, exps, log_coef, offset, cat_idx, cat_col = [], [], [], [], [], []
        # In dependency order (a derived leaf may read others), with the pass of each.
        depth = depths(program.derived)
        derived = sorted(
            ((key, program.derived[key], depth[key]) for key in keys if key in program.derived),
            key=lambda kdp: kdp[2],
        )
        for i, key in enumerate(keys):
            formula = local.get(key) or self.formulas.get(key)
            if key in program.derived:
                continue  # NaN here; computed from the other leaves (regions.derive)
            if formula is None:
                if point_values:
                    const[i] = program.values[key]
            elif formula.kind == "const":
                const[i] = formula.value
            elif formula.kind == "cat":
                cat_idx.append(i)
                cat_col.append(formula.cat)
            else:
                mono_idx.append(i)
                exps.append(formula.exps)
                log_coef.append(formula.log_coef)
                offset.append(formula.value if formula.kind == "affine" else 0.0)
        width = self.n_columns
        bank = {
            "keys": keys,
            "const": torch.as_tensor(const, dtype=torch.float64)[None],
            "mono_idx": torch.as_tensor(mono_idx, dtype=torch.long),
            "exps": torch.as_tensor(np.asarray(exps, dtype=float).reshape(len(exps), width)),
            "log_coef": torch.as_tensor(log_coef, dtype=torch.float64),
            "offset": torch.as_tensor(offset, dtype=torch.float64),
            "cat_idx": torch.as_tensor(cat_idx, dtype=torch.long),
            "cat_col": torch.as_tensor(cat_col, dtype=torch.long),
            "derived": derived,
        }
        self._banks[cache_key] = bank
        return bank

    def missing(self, program: Program) -> list[str]:
        local = self._case_formulas.get(program.signature(), {})
        return [
            k
            for k in program.values
            if k not in self.formulas and k not in local and k not in program.derived
        ]

    def features_at(
        self, decisions: dict[int, Any], mode: str = "exact", refit: bool = True
    ) -> torch.Tensor | None:
        """(stores, 164) at integer decisions, from the formulas; None if TVM rejects them.
        ``refit=False``: the search's fast path (see ``features``)."""
        probe = self.replay(decisions)
        if probe is None:
            return None
        if refit:
            self.fit_case(probe)
        log_f, cats = self.columns(probe.decisions)
        log_t = torch.as_tensor(log_f, dtype=torch.float64)[None]
        cat_t = torch.as_tensor(cats, dtype=torch.float64)[None]
        case = compiled(probe.program, self._bank(probe.program, not refit))
        return evaluate_cases([case], log_t, cat_t, mode)[0]

    def features(
        self, x: torch.Tensor, mode: str = "smooth", refit: bool = True
    ) -> list[torch.Tensor | None]:
        """Per point of ``x`` (batch, dim): (stores, 164) features, differentiable in ``x``;
        None where the rounded point is invalid. All points are evaluated together, in one
        pass over their cases (``compiled.evaluate_cases``).

        ``refit=False`` is the search's fast path: a new case costs one TVM replay instead of
        its neighbourhood; sketch-wide formulas are trusted and leaves without one take their
        value at the rounded point (exact there, constant around it)."""
        log_f, cats = self.continuous_columns(x)
        probes: list[tuple[int, Probe]] = []
        out: list[torch.Tensor | None] = [None] * x.shape[0]
        rounded = [self.variables.round(row) for row in x.detach().numpy()]
        for i, probe in enumerate(self._replay_all(rounded, self._threaded_apply())):
            if probe is not None:
                if refit:
                    self.fit_case(probe)
                probes.append((i, probe))
        if not probes:
            return out
        # Every case's fit is done before any bank is built from it (as in fit_case's order).
        cases = [compiled(p.program, self._bank(p.program, not refit)) for _, p in probes]
        idx = [i for i, _ in probes]
        if len(idx) < x.shape[0]:
            log_f, cats = log_f[idx], cats[idx]
        # All points in one pass, whatever their cases (compiled.evaluate_cases).
        for i, values in zip(idx, evaluate_cases(cases, log_f, cats, mode), strict=True):
            out[i] = values
        return out

    def penalties(self, x: torch.Tensor) -> torch.Tensor:
        """Σ relu(g(x))² over the constraints g ≤ 0 of the region where points round validly
        (``_linear``), plus the GPU limits on GPU targets (batch,)."""
        lin = self._linear
        total = torch.relu(x @ lin["a"].to(x.dtype) - lin["b"].to(x.dtype)).pow(2).sum(1)
        if self.is_gpu and self.target is not None:
            total = total + self._gpu_penalties(x)
        return total

    def _gpu_penalties(self, x: torch.Tensor) -> torch.Tensor:
        log_f, cats = self.continuous_columns(x)
        out = torch.zeros(x.shape[0], dtype=x.dtype)
        for i in range(x.shape[0]):
            probe = self.replay(self.variables.round(x[i].detach().numpy()))
            if probe is None:
                continue
            leaves = self.leaves(probe.program, log_f[i : i + 1], cats[i : i + 1], True)
            out = (
                out
                + torch.nn.functional.one_hot(torch.tensor(i), x.shape[0]).to(x.dtype)
                * (gpu_penalties(probe.program, leaves, self.target)[0])
            )
        return out
