"""Leaf formulas: every schedule-dependent integer of a program as a closed form of the
sketch's decisions, found by probing (DESIGN §4.2).

A sketch is replayed at random valid decisions; each leaf (loop extent, elements touched per
loop level, stride, buffer shape, unroll step) is matched by name across the replays and fitted
to, in order: a constant; a categorical decision itself; an exact monomial c · Π fᵢ^eᵢ of the
inner tile factors with integer exponents (log-linear least squares, exponents rounded, then
checked exactly on every probe); an affine monomial a + c · Π fᵢ^eᵢ (convolution halos,
``(tile − 1) · stride + kernel``). A leaf that fits none of them is *unsupported* and reported
with its probes, never approximated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

# Offsets tried for affine leaves: halos are (kernel − stride)-sized, small in practice.
_AFFINE_OFFSETS = [a for k in range(1, 33) for a in (-k, k)]


@dataclass
class LeafFormula:
    kind: str  # const | cat | mono | affine
    value: float = 0.0  # const: the value; affine: the offset a
    log_coef: float = 0.0  # mono/affine: log c
    exps: np.ndarray | None = None  # mono/affine: integer exponents over the factor columns
    cat: int = -1  # cat: the categorical column

    def __str__(self) -> str:
        if self.kind == "const":
            return f"{self.value:g}"
        if self.kind == "cat":
            return f"c{self.cat}"
        terms = [f"f{j}^{int(e)}" if e != 1 else f"f{j}" for j, e in enumerate(self.exps) if e]
        mono = " · ".join([f"{math.exp(self.log_coef):.6g}", *terms])
        return mono if self.kind == "mono" else f"{self.value:g} + {mono}"

    def evaluate(self, log_factors: torch.Tensor, cats: torch.Tensor) -> torch.Tensor:
        """(batch,) values from log inner factors (batch, F) and categorical values (batch, C)."""
        if self.kind == "const":
            return torch.full(log_factors.shape[:1], self.value, dtype=torch.float64)
        if self.kind == "cat":
            return cats[:, self.cat].to(torch.float64)
        exps = torch.as_tensor(self.exps, dtype=torch.float64)
        mono = torch.exp(self.log_coef + log_factors @ exps)
        return mono if self.kind == "mono" else mono + self.value


def _fit_monomial(log_f: np.ndarray, values: np.ndarray) -> LeafFormula | None:
    if np.any(values <= 0):
        return None
    log_v = np.log(values)
    design = np.hstack([log_f, np.ones((len(values), 1))])
    solution, *_ = np.linalg.lstsq(design, log_v, rcond=None)
    exps = np.rint(solution[:-1])
    log_coef = float(np.mean(log_v - log_f @ exps))
    predicted = np.exp(log_coef + log_f @ exps)
    if np.all(np.abs(predicted - values) <= 1e-6 * np.maximum(1.0, np.abs(values))):
        return LeafFormula(kind="mono", log_coef=log_coef, exps=exps)
    return None


def fit_leaf(log_f: np.ndarray, cats: np.ndarray, values: np.ndarray) -> LeafFormula | None:
    """The simplest closed form reproducing ``values`` exactly on every probe, or None.

    ``log_f``: (probes, F) log inner tile factors; ``cats``: (probes, C) categorical values.
    """
    values = np.asarray(values, dtype=float)
    if np.all(values == values[0]):
        return LeafFormula(kind="const", value=float(values[0]))
    for j in range(cats.shape[1]):
        if np.array_equal(cats[:, j], values):
            return LeafFormula(kind="cat", cat=j)
    mono = _fit_monomial(log_f, values)
    if mono is not None:
        return mono
    for offset in _AFFINE_OFFSETS:
        mono = _fit_monomial(log_f, values - offset)
        if mono is not None:
            mono.kind, mono.value = "affine", float(offset)
            return mono
    return None
