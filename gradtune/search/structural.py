"""Structural neighbours: a measured program's one-thread and whole-register variants.

Two loop decisions decide much of a CPU kernel's speed, and the cost model's features give
both only as magnitudes (``vectorize_len``, ``parallel_len``: log2(1 + extent)), so a smooth
model cannot learn where they matter:
- whether the vectorized innermost loop fills whole registers: an extent of 16 on AVX-512
  does, 10 or 19 leave a masked or scalar remainder;
- whether the kernel runs on one thread: waking the second core can cost more than it saves.
In the search benchmark's runs, MetaSchedule's evolutionary search kept more kernels of both
kinds than the descent, whose rounding leaves both to chance
(``bench/results/search_efficiency_kernels.md``). ``variants`` builds them from a task's
fastest measured programs, and ``GradientConfig.structural_variants`` measures them: the
measurement decides, and the fine-tuned cost model and the next rounds' elites learn from it.

The variants are built from the tile decisions alone, without knowing which loop a
postprocessor will vectorize or parallelize, and each is kept only if its replayed program
shows the property (``vec_and_par``).
"""

from __future__ import annotations

import math
from typing import Any

from gradtune.symbolic.sketch import SymbolicSketch, decision_key
from gradtune.symbolic.variables import TileVar

# How many innermost extents per tile variable an aligned variant tries (the nearest multiples
# of the register's lanes below and above the current extent): each costs one replay.
ALIGNED_TRIES = 2


def register_lanes(target: Any) -> int:
    """fp32 lanes of one vector register of an LLVM ``target`` (16 with AVX-512, 8 with AVX2,
    the vector width / 32 otherwise); 0 for a target that is not a CPU."""
    if str(target.kind.name) != "llvm":
        return 0
    from tvm.target import codegen

    if codegen.llvm_cpu_has_features("avx512f", target):
        return 16
    if codegen.llvm_cpu_has_features("avx2", target):
        return 8
    return max(1, int(codegen.llvm_get_vector_width(target)) // 32)


def vec_and_par(mod: Any) -> tuple[int, int]:
    """The vectorized and parallel extents (1: none) of the loops around the module's
    reductions: a padding or write-back stage of the same program is vectorized and
    parallelized on its own, and its loops say nothing of the compute's. A module without
    a reduction: the widest of all its loops."""
    nests = _nests(mod)
    around = [loops for reduces, loops in nests if reduces] or [loops for _, loops in nests]
    vec = max((e for loops in around for k, e in loops if k == "vectorized"), default=1)
    par = max((e for loops in around for k, e in loops if k == "parallel"), default=1)
    return vec, par


def _nests(mod: Any) -> list[tuple[bool, list[tuple[str, int]]]]:
    """Per block of ``main``: whether it reduces, and its vectorized and parallel enclosing
    loops as (kind, extent)."""
    import tvm

    kinds = {tvm.tirx.ForKind.VECTORIZED: "vectorized", tvm.tirx.ForKind.PARALLEL: "parallel"}
    nests: list[tuple[bool, list[tuple[str, int]]]] = []

    def visit(stmt: Any, around: list[tuple[str, int]]) -> None:
        if isinstance(stmt, tvm.tirx.For):
            if stmt.kind in kinds:
                around = [*around, (kinds[stmt.kind], int(stmt.extent))]
            visit(stmt.body, around)
        elif type(stmt).__name__ == "SBlockRealize":
            block = stmt.block
            reduces = any(int(v.iter_type) == 2 for v in block.iter_vars)  # CommReduce
            nests.append((reduces, around))
            visit(block, around)
        elif type(stmt).__name__ == "SeqStmt":
            for child in stmt.seq:
                visit(child, around)
        elif hasattr(stmt, "body"):
            visit(stmt.body, around)

    visit(mod["main"].body, [])
    return nests


def aligned(vec: int, lanes: int) -> bool:
    """Whether a vector extent fills whole registers of ``lanes`` fp32 lanes; on an AVX-512
    CPU whole 8-lane AVX2 registers count too (channel counts such as 24 allow no 16)."""
    unit = min(lanes, 8)
    return vec >= unit and vec % unit == 0


def _multi_level(sym: SymbolicSketch) -> list[TileVar]:
    # Spatial loops are tiled in more than two levels by MetaSchedule's CPU and GPU rules
    # (SSRSRS, SSSRRSRS); reductions in two. The outer spatial levels are what the parallel
    # postprocessor fuses, the innermost what it vectorizes.
    return [v for v in sym.variables.tiles if v.n > 2]


def serial_decisions(sym: SymbolicSketch, decisions: dict[int, Any]) -> dict[int, Any] | None:
    """``decisions`` with every multi-level tile's outermost factor moved into the next level:
    nothing left for the parallel loop. None if that changes nothing."""
    out = dict(decisions)
    for var in _multi_level(sym):
        factors = list(decisions[var.index])
        if factors[0] > 1:
            out[var.index] = [1, factors[0] * factors[1], *factors[2:]]
    return out if out != decisions else None


def aligned_decisions(
    sym: SymbolicSketch, decisions: dict[int, Any], lanes: int
) -> list[dict[int, Any]]:
    """``decisions`` with one multi-level tile's innermost factor set to a multiple of
    ``lanes`` that divides its extent (the nearest below and above the current one), the
    middle factors kept where they still divide, the outermost taking the rest."""
    out = []
    for var in _multi_level(sym):
        factors = list(decisions[var.index])
        ceiling = var.max_innermost if var.max_innermost > 0 else var.extent
        options = [t for t in range(lanes, ceiling + 1, lanes) if var.extent % t == 0]
        options = [t for t in options if t != factors[-1]]
        options.sort(key=lambda t: abs(math.log(t / factors[-1])))
        for inner in options[:ALIGNED_TRIES]:
            rest = var.extent // inner
            middle = []
            for f in factors[1:-1]:
                kept = math.gcd(f, rest)
                middle.append(kept)
                rest //= kept
            out.append({**decisions, var.index: [rest, *middle, inner]})
    return out


class StructuralNeighbours:
    """One task's verified variants per measured program, cached: a task's fastest programs
    change rarely between rounds, and each variant costs a replay."""

    def __init__(self, lanes: int) -> None:
        self.lanes = lanes
        # (sketch, decision key) -> (the one-thread variant or None, whole-register variants)
        self._cache: dict[tuple, tuple[dict[int, Any] | None, list[dict[int, Any]]]] = {}

    def variants(
        self, k: int, sym: SymbolicSketch, decisions: dict[int, Any], one_thread: bool = True
    ) -> list[dict]:
        """The one-thread variant of ``decisions`` if it runs in parallel (and ``one_thread``),
        and whole-register variants if its vector extent does not fill whole registers; each
        checked on its replayed program. The one-thread variant first: it moves one decision
        kind only."""
        key = (k, decision_key(decisions))
        if key not in self._cache:
            self._cache[key] = self._verified(sym, decisions)
        serial, whole = self._cache[key]
        return [serial, *whole] if one_thread and serial is not None else list(whole)

    def _verified(
        self, sym: SymbolicSketch, decisions: dict[int, Any]
    ) -> tuple[dict[int, Any] | None, list[dict[int, Any]]]:
        probe = sym.replay(decisions)
        if probe is None:
            return None, []
        vec, par = vec_and_par(probe.schedule.mod)
        serial = serial_decisions(sym, decisions) if par > 1 else None
        if serial is not None:
            p = sym.replay(serial)
            serial = serial if p is not None and vec_and_par(p.schedule.mod)[1] == 1 else None
        whole = []
        if not aligned(vec, self.lanes):
            for candidate in aligned_decisions(sym, decisions, self.lanes):
                p = sym.replay(candidate)
                if p is not None and aligned(vec_and_par(p.schedule.mod)[0], self.lanes):
                    whole.append(candidate)
        return serial, whole
