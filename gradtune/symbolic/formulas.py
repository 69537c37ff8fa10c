"""Leaf formulas: every schedule-dependent integer of a program as a closed form of the
sketch's decisions, found by probing: replaying a sketch at random
perfect tilings keeps its loop names and order, and every extent fits a closed form.

A sketch is replayed at random valid decisions; each leaf (loop extent, elements touched per
loop level, stride, buffer shape, unroll step) is matched by name across the replays and fitted
to, in order: a constant; a categorical decision itself; an exact monomial c · Π fᵢ^eᵢ of the
inner tile factors and positive categoricals (vector lengths) with integer exponents
(log-linear least squares, exponents rounded, then checked exactly on every probe); an affine
monomial a + c · Π fᵢ^eᵢ (convolution halos, ``(tile − 1) · stride + kernel``). A leaf that
fits none of them is *unsupported* and reported with its probes, never approximated.
"""

from __future__ import annotations

import dataclasses
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
    return fit_leaves(log_f, cats, np.asarray(values, dtype=float)[:, None])[0]


# Screening bounds. A monomial passing ``_fit_monomial``'s check (relative error ≤ 1e-6 on
# values ≥ 1) is within -log(1 − 1e-6) ≈ 1.0000005e-6 of every value in log space. The screens
# below allow twice that, so they can only let through fits that then fail, never drop one.
_LOG_TOLERANCE = 2e-6


def fit_leaves(log_f: np.ndarray, cats: np.ndarray, values: np.ndarray) -> list[LeafFormula | None]:
    """``fit_leaf`` of every column of ``values`` (probes, K) over the same probes: the same
    formulas, found with one least-squares screen for all columns and offsets instead of up
    to 65 solves per leaf (most leaves have no monomial form at most offsets)."""
    values = np.asarray(values, dtype=float)
    out: list[LeafFormula | None] = [None] * values.shape[1]
    todo = ~np.all(values == values[0], axis=0)
    for i in np.flatnonzero(~todo):
        out[i] = LeafFormula(kind="const", value=float(values[0, i]))
    for j in range(cats.shape[1]):
        hit = todo & np.all(cats[:, j : j + 1] == values, axis=0)
        for i in np.flatnonzero(hit):
            out[i] = LeafFormula(kind="cat", cat=j)
        todo &= ~hit
    cols = np.flatnonzero(todo)
    if not cols.size:
        return out
    # Many leaves repeat another's values (a loop's extent and the region it spans, a buffer's
    # shape): fit each distinct column once.
    distinct, first = np.unique(values[:, cols], axis=1, return_inverse=True)
    first = first.reshape(-1)
    fitted = _fit_monomials(log_f, distinct)
    for n, i in enumerate(cols):
        found = fitted[first[n]]
        out[i] = None if found is None else dataclasses.replace(found, exps=found.exps.copy())
    return out


def _fit_monomials(log_f: np.ndarray, values: np.ndarray) -> list[LeafFormula | None]:
    """Per column of ``values``: the monomial, else the affine monomial with the first offset
    of ``_AFFINE_OFFSETS`` that ``_fit_monomial`` accepts, else None."""
    out: list[LeafFormula | None] = [None] * values.shape[1]
    offsets = [0, *_AFFINE_OFFSETS]
    shifted = values[None] - np.asarray(offsets, dtype=float)[:, None, None]
    positive = ~np.any(shifted <= 0, axis=1)  # (offsets, leaves): _fit_monomial's precondition
    screened = positive & np.all(shifted >= 1, axis=1)
    candidate = positive & ~_misfit(log_f, shifted, screened)
    for i in range(values.shape[1]):
        for o in np.flatnonzero(candidate[:, i]):
            offset = offsets[o]
            # A contiguous copy: the scalar fit then sees the very array it always saw.
            column = np.ascontiguousarray(values[:, i])
            mono = _fit_monomial(log_f, column - offset if offset else column)
            if mono is not None:
                if offset:
                    mono.kind, mono.value = "affine", float(offset)
                out[i] = mono
                break
    return out


def _misfit(log_f: np.ndarray, shifted: np.ndarray, screened: np.ndarray) -> np.ndarray:
    """(offsets, leaves): where ``_fit_monomial`` is sure to fail on ``shifted`` (offsets,
    probes, leaves), among the ``screened`` ones (values ≥ 1; below 1 the relative tolerance is
    looser in log space). Two screens, both implied by a pass:

    - the least-squares residual of the logs is small. It is bounded from below by projecting
      onto an orthonormal basis of a space containing the design's columns, so a rank-deficient
      design only lets more through;
    - with the exponents ``_fit_monomial`` would round (its very least-squares solutions, see
      ``_solutions``), the logs minus the monomial's are nearly constant. Few probes (a leaf of
      a rare case) fit any values exactly, and only this screen tells them apart."""
    rows = shifted.shape[1]
    design = np.hstack([log_f, np.ones((rows, 1))])
    out = np.zeros(screened.shape, dtype=bool)
    o_idx, n_idx = np.nonzero(screened)
    if not o_idx.size:
        return out
    # One contiguous row per (offset, leaf), as _fit_monomial takes the log of a column.
    logs = np.log(np.ascontiguousarray(shifted[o_idx, :, n_idx]))
    basis, _ = np.linalg.qr(design, mode="reduced")
    residual = logs - (logs @ basis) @ basis.T
    far = np.sqrt(np.einsum("ij,ij->i", residual, residual)) > _LOG_TOLERANCE * math.sqrt(rows)
    near = np.flatnonzero(~far)
    solutions = _solutions(design, logs[near])
    if solutions is not None:
        with np.errstate(invalid="ignore"):
            gap = logs[near] - np.rint(solutions[:, :-1]) @ log_f.T
            spread = gap.max(1) - gap.min(1)
        far[near] = np.isfinite(spread) & (spread > 2 * _LOG_TOLERANCE)
    out[o_idx, n_idx] = far
    return out


def _solutions(design: np.ndarray, logs: np.ndarray) -> np.ndarray | None:
    """``np.linalg.lstsq(design, row)[0]`` for every row of ``logs``, bit for bit: the same
    LAPACK gufunc ``lstsq`` calls, looped over the rows inside one call (workspace sized once
    for the same shapes, one ``gelsd`` per row). None if numpy no longer exposes it."""
    try:
        from numpy.linalg import _umath_linalg
    except ImportError:
        return None
    if not logs.shape[0]:
        return np.zeros((0, design.shape[1]))
    rcond = np.finfo(float).eps * max(design.shape)
    # A failed SVD gives NaNs here (lstsq raises): they pass the screen, to fail as before.
    with np.errstate(invalid="ignore", over="ignore", divide="ignore", under="ignore"):
        x = _umath_linalg.lstsq(design, logs[:, :, None], rcond, signature="ddd->ddid")[0]
    return x[:, :, 0]
