"""A source schedule re-applied to another workload of its kernel class.

What was chosen, and why: the source's trace is replayed on the target task's own sketch, not
on the source's module. A measured trace is its sketch's instructions followed by the
postprocessors'; the target task's design space (MetaSchedule's post-order-apply, the same
rules that made the source's) holds a sketch with the same instructions whenever the kernel
class is the same, shapes aside. That sketch is found by its instruction text without
decisions, postprocessors and dead code (``shape_free_text``), and the source's decisions are
put into it. A source of the same anchor operator with another elementwise epilogue (the
library's transfer class, ``library.transfer_class``) has a sketch that differs only in the
blocks MetaSchedule inlines away; that sketch is found by ``structure_text``, and the candidate
counts as adapted:

- ``SamplePerfectTile``: kept when the factors still tile the new extent exactly
  (**applied**); otherwise the nearest perfect tiling of the new extent (**adapted**):
  the inner factors, which set the tile sizes the schedule was tuned for, as close as possible
  in log2 space, the outer factor the quotient, ``max_innermost_factor`` respected. These are
  the symbolic layer's valid decisions (``TileVar.tilings``, the set its rounding maps into);
  keeping inner factors is the paper's Split(N, N/8, 8) reformulation (§4.1).
- ``SampleCategorical`` (unroll steps, vector lengths): the same candidate (nearest value
  should the candidates differ).
- ``SampleComputeLocation``: the source's loop, and should that not apply, the sketch's own.

The instantiated trace then goes through the sketch's postprocessors, as every candidate
does. Decisions TVM would silently repair are read back from the applied trace. Anything
that cannot be applied is a **failed** candidate: counted, never fatal.

MetaSchedule's trace replay with decision mutation was the alternative: it re-samples a
mutated decision at random, where this keeps what the source's search found.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

from ..partition import TuningTask
from ..symbolic.variables import SketchVariables, TileVar, sampling_insts_of
from .library import Schedule

log = logging.getLogger(__name__)

APPLIED, ADAPTED, FAILED = "applied", "adapted", "failed"


@dataclass
class DesignSpace:
    """A task's sketches and postprocessors, as MetaSchedule generates them."""

    mod: Any
    sketches: list[Any]  # traces
    postprocs: list[Any]
    # Each sketch's texts, computed once: every source schedule is compared with all of them,
    # once to order the candidates and once to apply them.
    _texts: dict[str, list[str]] = field(default_factory=dict, repr=False, compare=False)

    def texts(self, kind: str) -> list[str]:
        """``shape_free_text`` (``kind`` "exact") or ``structure_text`` of every sketch."""
        if kind not in self._texts:
            text = shape_free_text if kind == "exact" else structure_text
            self._texts[kind] = [text(sketch) for sketch in self.sketches]
        return self._texts[kind]

    @classmethod
    def of(cls, task: TuningTask, target: Any) -> DesignSpace:
        from ..symbolic.verify import design_space

        _, spaces, postprocs = design_space(task.mod, target, seed=0)
        return cls(task.mod, [s.trace for s in spaces], postprocs)


@dataclass
class Candidate:
    """A source schedule on the target task: the schedule, or why there is none."""

    origin: Schedule
    status: str  # APPLIED, ADAPTED or FAILED
    schedule: Any = None  # tvm.s_tir.Schedule, postprocessed
    reason: str = ""
    changed: list[str] = field(default_factory=list)  # decisions adapted, for the log


def nearest_tiling(var: TileVar, factors: list[int]) -> list[int]:
    """The valid perfect tiling of ``var.extent`` whose inner factors are nearest to
    ``factors``' inner ones in log2 space (outer factor first, as TVM's decisions)."""
    wanted = [math.log2(max(1, f)) for f in factors[1:]]

    def distance(tiling: list[int]) -> tuple[float, int]:
        d = sum((math.log2(f) - w) ** 2 for f, w in zip(tiling[1:], wanted, strict=True))
        return d, -tiling[-1]  # ties: the larger innermost factor (vectorizes more)

    return min(var.tilings(), key=distance)


def adapt_decisions(
    sketch: Any, source_trace: Any
) -> tuple[dict[int, Any], dict[int, Any], list[str]] | None:
    """The source's decisions in the sketch's sampling positions, tiles fitted to the
    sketch's extents: (decisions, compute-location decisions, what was changed); None when
    the two traces do not sample alike."""
    mine = sampling_insts_of(sketch)
    theirs = sampling_insts_of(source_trace)
    if [i.kind.name for i in mine] != [i.kind.name for i in theirs]:
        return None
    variables = SketchVariables.from_trace(sketch)
    tiles = {v.index: v for v in variables.tiles}
    cats = {v.index: v for v in variables.categoricals}
    decisions: dict[int, Any] = {}
    locations: dict[int, Any] = {}
    changed: list[str] = []
    for i, inst in enumerate(theirs):
        value = source_trace.decisions.get(inst)
        if value is None:
            return None
        if i in tiles:
            factors = [int(v) for v in value]
            var = tiles[i]
            fits = math.prod(factors) == var.extent and (
                var.max_innermost <= 0 or factors[-1] <= var.max_innermost
            )
            if len(factors) != var.n:
                return None
            decisions[i] = factors if fits else nearest_tiling(var, factors)
            if not fits:
                changed.append(f"tile {factors} → {decisions[i]}")
        elif i in cats:
            var = cats[i]
            their_candidates = [int(c) for c in inst.attrs[0]]
            choice = int(value)
            if their_candidates == var.candidates:
                decisions[i] = choice
            else:
                wanted = their_candidates[choice]
                decisions[i] = min(
                    range(len(var.candidates)), key=lambda k: abs(var.candidates[k] - wanted)
                )
                changed.append(f"categorical {wanted} → {var.candidates[decisions[i]]}")
        elif inst.kind.name == "SampleComputeLocation":
            locations[i] = int(value)
    return decisions, locations, changed


def instantiate(space: DesignSpace, sketch: Any, decisions: dict[int, Any]) -> Any | None:
    """The sketch with ``decisions`` (sampling index → value) applied to the task's module and
    postprocessed; None when a postprocessor rejects it."""
    import tvm

    insts = sampling_insts_of(sketch)
    trace = sketch
    for index, value in decisions.items():
        trace = trace.with_decision(insts[index], value, remove_postproc=True)
    sch = tvm.s_tir.Schedule(space.mod)
    trace.apply_to_schedule(sch, remove_postproc=False)
    # As MetaSchedule marks it: the database's trace then tells sketch from postprocessing.
    sch.enter_postproc()
    for postproc in space.postprocs:
        if not postproc.apply(sch):
            return None
    return sch


def shape_free_text(trace: Any) -> str:
    """A trace's instructions without decisions, postprocessors or dead code: equal for a
    measured program and the sketch it instantiates, whatever the shapes. (The database keeps
    a measured trace with its unused block lookups dropped; a sketch has them.)"""
    from ..search.gradient_search import trace_signature

    simple = trace.simplified(remove_postproc=True)
    return trace_signature(simple, len(simple.insts))


_INLINES = frozenset({"ComputeInline", "ReverseComputeInline"})
_HANDLES = frozenset({"SBlockRV", "LoopRV", "Var"})  # random variables, not constants


def structure_text(trace: Any) -> str:
    """``shape_free_text`` without the inlined blocks: equal for two kernels whose anchor is
    scheduled alike and whose elementwise epilogues differ. MetaSchedule's AutoInline folds an
    epilogue (``add+relu``, or BatchNorm's ``subtract+divide+multiply+add+relu``) into one
    consumer block, so such sketches differ only in the lookups and inlinings of the blocks
    folded away; their sampling instructions, and the loops they tile, are the same."""
    simple = trace.simplified(remove_postproc=True)
    inlined = [inst.inputs[0] for inst in simple.insts if inst.kind.name in _INLINES]
    defined: list[Any] = []  # random variables in order of definition: their names here

    def name(x: Any) -> str:
        if type(x).__name__ not in _HANDLES:
            return str(x)
        return f"v{next((i for i, d in enumerate(defined) if d.same_as(x)), -1)}"

    lines = []
    for inst in simple.insts:
        kind = inst.kind.name
        if kind in _INLINES:
            continue
        if kind == "GetSBlock" and any(inst.outputs[0].same_as(b) for b in inlined):
            continue
        # Which loop or block an instruction acts on tells sketches apart (a consumer
        # computed at one tiling level or another), so variables are named by definition.
        lines.append(f"{kind} {[str(a) for a in inst.attrs]} {[name(x) for x in inst.inputs]}")
        defined += list(inst.outputs)
    return "\n".join(lines)


def _matching_sketches(space: DesignSpace, origin: Schedule) -> list[tuple[Any, list[str]]]:
    """The task's sketches with the origin's instructions: exactly, else up to the inlined
    epilogue (noted, so the candidate counts as adapted)."""
    wanted = shape_free_text(origin.trace)
    texts = zip(space.sketches, space.texts("exact"), strict=True)
    exact = [(s, []) for s, t in texts if t == wanted]
    if exact:
        return exact
    structure = structure_text(origin.trace)
    note = f"epilogue of {origin.kernel_class}"
    pairs = zip(space.sketches, space.texts("structure"), strict=True)
    return [(s, [note]) for s, t in pairs if t == structure]


def transfer_schedule(space: DesignSpace, origin: Schedule) -> Candidate:
    """``origin`` (a schedule of another workload of the task's transfer class) on the task."""
    matched = False
    reasons = []
    for sketch, epilogue in _matching_sketches(space, origin):
        adapted = adapt_decisions(sketch, origin.trace)
        if adapted is None:
            continue
        matched = True
        decisions, locations, changed = adapted
        changed = [*epilogue, *changed]
        # The source's compute locations first; the loop it names may not exist here.
        attempts = [({**decisions, **locations}, changed)]
        if locations:
            attempts.append((decisions, [*changed, "compute location of the sketch"]))
        for chosen, notes in attempts:
            try:
                sch = instantiate(space, sketch, chosen)
            except Exception as err:  # TVM refuses a decision: try the next attempt
                reasons.append(str(err).strip().splitlines()[-1][:200] if str(err) else "error")
                continue
            if sch is None:
                reasons.append("a postprocessor rejected it")
                continue
            status = ADAPTED if notes else APPLIED
            return Candidate(origin, status, sch, changed=notes)
    if not matched:
        return Candidate(origin, FAILED, reason="no sketch of this task has its instructions")
    return Candidate(origin, FAILED, reason="; ".join(dict.fromkeys(reasons)))


def shape_distance(sketch: Any, source_trace: Any) -> float:
    """How far the loops the source tiled are from the sketch's: the sum over tiled loops of
    the squared log2 ratio of their extents (0 for the same shape), the source's extent being
    the product of its tile factors."""
    theirs = sampling_insts_of(source_trace)
    total = 0.0
    for var in SketchVariables.from_trace(sketch).tiles:
        value = source_trace.decisions.get(theirs[var.index]) if var.index < len(theirs) else None
        if value is not None:
            extent = max(1, math.prod(int(v) for v in value))
            total += (math.log2(var.extent) - math.log2(extent)) ** 2
    return total


def nearest_first(space: DesignSpace, schedules: list[Schedule]) -> list[Schedule]:
    """``schedules`` by the shape distance of their nearest matching sketch (those matching
    none last): a schedule tuned for extents like the task's needs the fewest adaptations.
    The sort is stable, so at equal distance the given order (exact class first) holds."""

    def distance(origin: Schedule) -> float:
        found = [shape_distance(sk, origin.trace) for sk, _ in _matching_sketches(space, origin)]
        return min(found, default=math.inf)

    return sorted(schedules, key=distance)


def candidates_for(
    task: TuningTask, space: DesignSpace, schedules: list[Schedule], limit: int
) -> list[Candidate]:
    """Up to ``limit`` distinct programs for ``task`` from ``schedules``, nearest in shape
    first (``nearest_first``), and every failed attempt on the way."""
    out: list[Candidate] = []
    seen: set[str] = set()
    ok = 0
    for origin in nearest_first(space, schedules):
        if ok >= limit:
            break
        candidate = transfer_schedule(space, origin)
        if candidate.status != FAILED:
            key = str(candidate.schedule.trace)
            if key in seen:  # two sources' schedules adapted to the same program
                continue
            seen.add(key)
            ok += 1
        else:
            log.info("%s: schedule of %s failed: %s", task.name, origin.task, candidate.reason)
        out.append(candidate)
    return out
