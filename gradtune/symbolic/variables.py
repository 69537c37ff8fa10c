"""The variables of a sketch and ``decode``: continuous point → valid MetaSchedule trace.

Felix (§3.2) optimizes tile sizes in log space. Here each ``SamplePerfectTile(n, extent E)``
contributes, for each of its n−1 inner factors, one real exponent per prime of E (the outer
factor is the quotient). Rounding exponents, clipping them so each prime's exponents fit in
E's, always yields a perfect tiling, so no point decodes to an invalid tile;
``max_innermost_factor`` is enforced while rounding, because TVM enforces it only when it
samples. ``SampleCategorical`` (unroll steps, vector lengths) is relaxed to log2(1 + value)
and snapped to the nearest candidate. Compute-location samples stay as the sketch has them:
they are discrete per sketch variant.

TVM silently repairs tile decisions it cannot use, so ``decode`` reads the decisions back
from the applied schedule's trace instead of trusting its own.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np


def prime_factors(n: int) -> dict[int, int]:
    return dict(_prime_factors(n))


@functools.lru_cache(maxsize=4096)
def _prime_factors(n: int) -> dict[int, int]:
    """Shared between callers (never mutate it): every probe encodes the same few factors."""
    factors: dict[int, int] = {}
    p = 2
    while p * p <= n:
        while n % p == 0:
            factors[p] = factors.get(p, 0) + 1
            n //= p
        p += 1
    if n > 1:
        factors[n] = factors.get(n, 0) + 1
    return factors


@dataclass
class TileVar:
    """One ``SamplePerfectTile``: variables are the inner factors' prime exponents."""

    index: int  # position among the trace's sampling instructions
    extent: int
    n: int
    max_innermost: int  # <= 0: unbounded
    primes: list[int] = field(default_factory=list)
    totals: list[int] = field(default_factory=list)  # exponent of each prime in the extent

    @property
    def size(self) -> int:
        return (self.n - 1) * len(self.primes)

    def round(self, x: np.ndarray) -> list[int]:
        """Real exponents (inner factors × primes) → a perfect tiling, outer factor first."""
        exps = np.maximum(np.rint(x.reshape(self.n - 1, len(self.primes))), 0).astype(int)
        if exps.size and exps.min() < 0:
            # Non-finite or huge x wraps to negative ints: fail as numpy's int power did.
            raise ValueError("Integers to negative integer powers are not allowed.")
        # Plain ints from here: numpy's per-call overhead dominates on arrays this small.
        rows = exps.tolist()
        for j, total in enumerate(self.totals):
            # Over budget: take exponents back from the largest inner factor first.
            column = [row[j] for row in rows]
            while sum(column) > total:
                i = column.index(max(column))
                rows[i][j] -= 1
                column[i] -= 1
        inner = [math.prod(p**e for p, e in zip(self.primes, row, strict=True)) for row in rows]
        if self.max_innermost > 0:
            # Innermost too large: move its largest primes to the outer factor.
            row = rows[-1]
            while inner[-1] > self.max_innermost:
                j = max(
                    (j for j in range(len(self.primes)) if row[j] > 0), key=lambda j: self.primes[j]
                )
                row[j] -= 1
                inner[-1] //= self.primes[j]
        outer = self.extent // math.prod(inner)
        return [outer, *inner]

    def tilings(self) -> list[list[int]]:
        """Every tiling ``round`` can give: n factors (outer first) whose product is the
        extent, the innermost within ``max_innermost``."""

        def split(rest: int, k: int) -> list[list[int]]:
            if k == 1:
                return [[rest]]
            divisors = [1]
            for p, e in _prime_factors(rest).items():
                divisors = [d * p**k for d in divisors for k in range(e + 1)]
            return [[d, *tail] for d in divisors for tail in split(rest // d, k - 1)]

        return [
            t
            for t in split(self.extent, self.n)
            if self.max_innermost <= 0 or t[-1] <= self.max_innermost
        ]

    def encode(self, factors: list[int]) -> np.ndarray:
        exps = [[_prime_factors(f).get(p, 0) for p in self.primes] for f in factors[1:]]
        return np.asarray(exps, dtype=float).reshape(-1)


@dataclass
class CategoricalVar:
    """One ``SampleCategorical``: a single variable, log2(1 + candidate value)."""

    index: int
    candidates: list[int]

    size = 1

    def round(self, x: np.ndarray) -> int:
        """The index of the candidate nearest to ``x`` in log2(1 + value) space."""
        points = np.log2(1.0 + np.asarray(self.candidates, dtype=float))
        return int(np.argmin(np.abs(points - float(x[0]))))

    def encode(self, choice: int) -> np.ndarray:
        return np.asarray([np.log2(1.0 + self.candidates[choice])])


def sampling_insts_of(trace: Any) -> list[Any]:
    """The trace's sampling instructions, in order: the positions decisions are keyed by."""
    return [inst for inst in trace.insts if inst.kind.name.startswith("Sample")]


@dataclass
class SketchVariables:
    """The variables of one sketch; ``x`` is a flat vector over all of them."""

    trace: Any  # the sketch's trace (decisions as sampled when the space was generated)
    tiles: list[TileVar]
    categoricals: list[CategoricalVar]
    # The trace's sampling instructions, read once: every probe's decode needs them.
    _insts: list[Any] | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def from_trace(cls, trace: Any) -> SketchVariables:
        tiles, cats = [], []
        for i, inst in enumerate(sampling_insts_of(trace)):
            name = inst.kind.name
            if name == "SamplePerfectTile":
                decision = [int(v) for v in trace.decisions[inst]]
                extent = int(np.prod(decision))
                factors = prime_factors(extent)
                tiles.append(
                    TileVar(
                        index=i,
                        extent=extent,
                        n=int(inst.attrs[0]),
                        max_innermost=int(inst.attrs[1]),
                        primes=sorted(factors),
                        totals=[factors[p] for p in sorted(factors)],
                    )
                )
            elif name == "SampleCategorical":
                cats.append(CategoricalVar(index=i, candidates=[int(c) for c in inst.attrs[0]]))
        return cls(trace=trace, tiles=tiles, categoricals=cats)

    @property
    def sampling_insts(self) -> list[Any]:
        if self._insts is None:
            self._insts = sampling_insts_of(self.trace)
        return self._insts

    @property
    def variables(self) -> list[TileVar | CategoricalVar]:
        return sorted([*self.tiles, *self.categoricals], key=lambda v: v.index)

    @property
    def dim(self) -> int:
        return sum(v.size for v in self.variables)

    def _split(self, x: np.ndarray) -> list[tuple[TileVar | CategoricalVar, np.ndarray]]:
        x = np.asarray(x, dtype=float)
        if x.shape != (self.dim,):
            raise ValueError(f"point has shape {x.shape}, the sketch has {self.dim} variables")
        parts, offset = [], 0
        for var in self.variables:
            parts.append((var, x[offset : offset + var.size]))
            offset += var.size
        return parts

    def round(self, x: np.ndarray) -> dict[int, Any]:
        """Sampling-instruction index → decision (tile factors or candidate index)."""
        return {var.index: var.round(part) for var, part in self._split(x)}

    def encode(self, decisions: dict[int, Any]) -> np.ndarray:
        parts = [var.encode(decisions[var.index]) for var in self.variables]
        return np.concatenate(parts) if parts else np.zeros(0)

    def sketch_decisions(self) -> dict[int, Any]:
        """The decisions the sketch was generated with, in ``round``'s format."""
        insts = self.sampling_insts
        out: dict[int, Any] = {}
        for var in self.variables:
            value = self.trace.decisions[insts[var.index]]
            out[var.index] = [int(v) for v in value] if isinstance(var, TileVar) else int(value)
        return out

    def every_decision(self, limit: int) -> list[dict[int, Any]] | None:
        """All the decisions of the sketch, in ``round``'s format, or None if there are more
        than ``limit``."""
        options: list[tuple[int, list[Any]]] = []
        count = 1
        for var in self.variables:
            if isinstance(var, TileVar):
                values: list[Any] = var.tilings()
            else:
                values = list(range(len(var.candidates)))
            count *= len(values)
            if count > limit:
                return None
            options.append((var.index, values))
        return [
            dict(zip([index for index, _ in options], combo, strict=True))
            for combo in itertools.product(*(values for _, values in options))
        ]

    def random_point(self, rng: np.random.Generator) -> np.ndarray:
        """A point inside the constraint region: a random valid decision, encoded, plus jitter."""
        decisions = {}
        for var in self.variables:
            if isinstance(var, TileVar):
                raw = rng.uniform(0, 1, (var.n - 1, len(var.primes))) * (np.array(var.totals) + 1)
                decisions[var.index] = var.round(raw.reshape(-1))
            else:
                decisions[var.index] = int(rng.integers(len(var.candidates)))
        return self.encode(decisions) + rng.uniform(-0.3, 0.3, self.dim)

    def decode(
        self, mod: Any, x: np.ndarray, postprocs: list[Any] | None = None, start: Any = None
    ):
        """Apply the rounded point to ``mod``: (schedule or None if a postproc rejects it,
        decisions read back from the schedule's trace). ``start``: a schedule of ``mod`` with
        nothing applied, to copy instead of building one (a copy takes µs, a new schedule ~2
        ms of a ~10 ms decode, and the search decodes every point its descent rounds to)."""
        import tvm

        decisions = self.round(x)
        insts = self.sampling_insts
        trace = self.trace
        for index, value in decisions.items():
            trace = trace.with_decision(insts[index], value, remove_postproc=True)
        sch = tvm.s_tir.Schedule(mod) if start is None else start.copy()
        trace.apply_to_schedule(sch, remove_postproc=False)
        applied = SketchVariables(sch.trace, self.tiles, self.categoricals).sketch_decisions()
        if postprocs:
            # As MetaSchedule marks it. Without the mark, a database trace replayed with
            # remove_postproc=True (evolutionary search mutating its population, which starts
            # from the database's best) replays the postprocessors' get_loops too, and TVM
            # aborts when a mutated decision changed how many loops there are.
            sch.enter_postproc()
        for postproc in postprocs or []:
            if not postproc.apply(sch):
                return None, applied
        return sch, applied
