"""``gradtune symbolic verify``: the feature formulas of every sketch against TVM's own
``PerStoreFeature`` on random valid decisions the formulas were not fitted on.

For each sketch: build its symbolic schedule (probes + sketch-wide leaf fits), draw N random
valid decisions none of which is a probe, apply them in TVM, extract TVM's features, and
compare with the exact-mode formulas (leaves evaluated from the decisions; the case from the
rounded point). The per-case fits those comparisons trigger run on the samples' neighbours
with every sample held out (``SymbolicSketch.held_out``), and the run checks afterwards that
no fit saw a sample: a formula fitted on the point it is checked at would pass by
construction. A sketch is verified when ≥ 99% of its (store, feature, sample) values agree
within 1e-4. The smooth mode is compared at the same points to state its tolerance per
feature group.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gradtune.errors import GradtuneError
from gradtune.symbolic.features import FEATURE_NAMES, FEATURES, GROUPS
from gradtune.symbolic.gpu import gpu_verdict
from gradtune.symbolic.sketch import SymbolicSketch, decision_key
from gradtune.target import is_gpu as target_is_gpu
from gradtune.target import make_target, parse_target
from gradtune.tvm_compat import register_tensor_intrinsics

TOLERANCE = 1e-4
VERIFIED_FRACTION = 0.99
# A sketch whose random draws keep landing on its probes is enumerated up to this many
# decisions: its probes then cover most of its space, a few dozen points.
ENUMERATED = 256


@dataclass
class SketchReport:
    index: int
    samples: int = 0
    invalid_draws: int = 0
    values: int = 0
    matched: int = 0
    unresolved: int = 0  # values depending on a leaf with no formula in that case
    max_abs_err: float = 0.0
    build_seconds: float = 0.0
    mismatched_features: dict[str, int] = field(default_factory=dict)
    smooth_err: dict[str, float] = field(default_factory=dict)
    gpu_checks: int = 0  # GPU: points where our constraints' verdict was compared with TVM's
    gpu_agree: int = 0
    fitted_draws: int = 0  # draws equal to a probe the formulas were fitted on (drawn again)
    held_out: bool = False  # checked: no formula, sketch-wide or per case, saw a sample
    # Every valid point of the sketch was a probe (a tiny design space): the samples are all of
    # them, none held out.
    exhaustive: bool = False

    @property
    def fraction(self) -> float:
        return self.matched / self.values if self.values else 0.0

    @property
    def verified(self) -> bool:
        return self.samples > 0 and self.fraction >= VERIFIED_FRACTION

    def why(self) -> str:
        worst = sorted(self.mismatched_features.items(), key=lambda kv: -kv[1])[:4]
        names = ", ".join(f"{n} ({c})" for n, c in worst)
        if self.samples == 0:
            return (
                f"sketch {self.index}: no valid decision in {self.invalid_draws} draws "
                f"(and {self.fitted_draws} that were fitting probes)"
            )
        return f"sketch {self.index}: {self.fraction:.1%} exact; mismatched {names}"


def load_tvmscript(path: str | Path) -> Any:
    """The IRModule of a TVMScript file holding one static-shape PrimFunc (the task)."""
    import tvm

    path = Path(path)
    if not path.is_file():
        raise GradtuneError(f"{path}: no such file")
    text = path.read_text()
    try:
        parsed = tvm.script.from_source(text, check_well_formed=False)
    except Exception as err:  # the parser raises many types; the first line names the problem
        first = str(err).strip().splitlines()
        raise GradtuneError(
            f"{path}: not TVMScript ({first[0] if first else type(err).__name__})"
        ) from None
    if isinstance(parsed, tvm.tirx.PrimFunc):
        parsed = tvm.IRModule({"main": parsed})
    if not isinstance(parsed, tvm.IRModule):
        raise GradtuneError(f"{path}: not an IRModule or PrimFunc")
    funcs = [(gv, f) for gv, f in parsed.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    if not funcs:
        raise GradtuneError(f"{path}: the module has no PrimFunc")
    if len(funcs) > 1:
        names = ", ".join(gv.name_hint for gv, _ in funcs)
        raise GradtuneError(f"{path}: expected one PrimFunc (a tuning task), found {names}")
    gv, func = funcs[0]
    for param in func.params:
        shape = getattr(param, "shape", None)
        if shape is not None and any(not isinstance(s, tvm.tirx.IntImm) for s in shape):
            raise GradtuneError(
                f"{path}: PrimFunc {gv.name_hint} has dynamic shapes ({param.name}: "
                f"{list(shape)}); tuning tasks need static shapes"
            )
    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})


def design_space(mod: Any, target: Any, seed: int = -1) -> tuple[Any, list[Any], list[Any]]:
    """(TuneContext, sketches, postprocessors) of a task, as MetaSchedule builds them.

    The sketches' initial decisions are random draws; a seed >= 0 fixes them, so that a
    verification run can be repeated exactly (-1: MetaSchedule's own random seed).
    """
    from tvm.s_tir import meta_schedule as ms

    register_tensor_intrinsics(target.kind.name)
    ctx = ms.TuneContext(
        mod=mod,
        target=target,
        space_generator="post-order-apply",
        task_name="task",
        rand_state=seed,
    )
    return ctx, list(ctx.generate_design_space()), list(ctx.space_generator.postprocs)


def verify_module(
    mod: Any, target: Any, samples: int, seed: int = 0, progress: Any = None
) -> list[SketchReport]:
    """Every sketch of the task built and checked (``verify_sketch``), one rng for all."""
    ctx, sketches, postprocs = design_space(mod, target, seed)
    is_gpu = target_is_gpu(target)
    rng = np.random.default_rng(seed)
    reports = []
    for index, sketch in enumerate(sketches):
        start = time.perf_counter()
        sym = SymbolicSketch.build(
            mod, sketch.trace, postprocs, is_gpu=is_gpu, rng=rng, target=target
        )
        seconds = time.perf_counter() - start
        report = verify_sketch(sym, ctx, samples, rng, index, progress)
        report.build_seconds = seconds
        reports.append(report)
    return reports


def verify_sketch(
    sym: SymbolicSketch,
    ctx: Any,
    samples: int,
    rng: np.random.Generator,
    index: int = 0,
    progress: Any = None,
) -> SketchReport:
    """One built sketch against TVM's extractor on ``samples`` random valid decisions held
    out of every fit: none is a probe its sketch-wide formulas were fitted on (such a draw is
    drawn again; a small design space is enumerated for the points its probes missed), and
    all of them are ``held_out`` of the per-case fits, which run only after every sample is
    drawn. Raises if a formula was fitted on a sample all the same. A sketch with no valid
    point outside its probes is checked at all of them (``exhaustive``)."""
    from tvm.s_tir import meta_schedule as ms

    report = SketchReport(index)
    extractor = ms.feature_extractor.PerStoreFeature()
    args_info = ms.arg_info.ArgInfo.from_prim_func(sym.mod["main"])
    drawn: list[Any] = []
    draws = 0
    # Capped draws: a small design space may hold few valid points the probes missed.
    while len(drawn) < samples and draws < 4 * samples and report.fitted_draws < 4 * samples:
        probe = sym.replay(sym.random_decisions(rng))
        if probe is not None and decision_key(probe.decisions) in sym.fitted_on:
            report.fitted_draws += 1  # a point the formulas were fitted on tests nothing
            continue
        draws += 1
        if sym.is_gpu and probe is not None:
            ours = gpu_verdict(probe.program, sym.target)[0]
            report.gpu_checks += 1
            report.gpu_agree += ours == probe.valid
        if probe is None or not probe.valid:
            report.invalid_draws += 1
            continue
        drawn.append(probe)
    if len(drawn) < samples and report.fitted_draws >= 4 * samples:
        # The draws kept landing on probes: the design space is small, so look at all of it.
        unprobed, probed = _whole_space(sym)
        keys = {decision_key(probe.decisions) for probe in drawn}
        fresh = [probe for probe in unprobed if decision_key(probe.decisions) not in keys]
        drawn += fresh[: samples - len(drawn)]
        if not drawn and probed:
            drawn, report.exhaustive = probed, True
    if not report.exhaustive:
        sym.held_out = frozenset(decision_key(probe.decisions) for probe in drawn)
    for probe in drawn:
        report.samples += 1
        candidate = ms.MeasureCandidate(probe.schedule, args_info)
        ref = extractor.extract_from(ctx, [candidate])[0].numpy()
        got = sym.features_at(probe.decisions, "exact")
        got = got.detach().numpy() if got is not None else np.full_like(ref, np.nan)
        _compare(report, got, ref)
        x = torch.as_tensor(sym.variables.encode(probe.decisions))[None]
        smooth = sym.features(x, "smooth")[0]
        if smooth is not None and smooth.shape == ref.shape:
            diff = np.abs(smooth.detach().numpy() - ref)
            for name, lo, hi in GROUPS:
                err = float(np.nanmax(diff[:, lo:hi])) if diff.size else 0.0
                report.smooth_err[name] = max(report.smooth_err.get(name, 0.0), err)
        if progress is not None:
            progress()
    if not report.exhaustive:
        leaked = sym.fitted_on & sym.held_out
        if leaked:
            raise RuntimeError(f"sketch {index}: formulas were fitted on samples {sorted(leaked)}")
        report.held_out = True
    return report


def _whole_space(sym: SymbolicSketch) -> tuple[list[Any], list[Any]]:
    """The valid points of a sketch whose design space has at most ``ENUMERATED`` decisions,
    as (those no formula was fitted on, those some was); ([], []) for a larger space. When
    the first list is empty (a sketch whose only decision is an unroll step, say), no point
    can be held out: the formulas were fitted on every one, and the sketch is checked at
    every point instead."""
    every = sym.variables.every_decision(ENUMERATED)
    found: dict[tuple, Any] = {}
    for decisions in every or []:
        probe = sym.replay(decisions)
        if probe is not None and probe.valid:
            found.setdefault(decision_key(probe.decisions), probe)
    unprobed = [p for key, p in found.items() if key not in sym.fitted_on]
    probed = [p for key, p in found.items() if key in sym.fitted_on]
    return unprobed, probed


def _compare(report: SketchReport, got: np.ndarray, ref: np.ndarray) -> None:
    if got.shape != ref.shape:
        report.values += ref.size
        report.mismatched_features["store count"] = (
            report.mismatched_features.get("store count", 0) + ref.size
        )
        return
    diff = np.abs(got - ref)
    unresolved = np.isnan(diff)
    ok = (diff <= TOLERANCE) & ~unresolved
    report.values += diff.size
    report.matched += int(ok.sum())
    report.unresolved += int(unresolved.sum())
    finite = diff[~unresolved]
    if finite.size:
        report.max_abs_err = max(report.max_abs_err, float(finite.max()))
    for j in np.nonzero((~ok).any(0))[0]:
        name = FEATURE_NAMES[j]
        report.mismatched_features[name] = report.mismatched_features.get(name, 0) + int(
            (~ok[:, j]).sum()
        )


def summary(reports: list[SketchReport], samples: int) -> dict[str, Any]:
    values = sum(r.values for r in reports)
    return {
        "sketches": len(reports),
        "verified_sketches": sum(r.verified for r in reports),
        "samples": samples,
        "features": FEATURES,
        "exact_fraction": round(sum(r.matched for r in reports) / values, 6) if values else 0.0,
        "max_abs_err": max((r.max_abs_err for r in reports), default=0.0),
        "unsupported": [r.why() for r in reports if not r.verified],
        **(
            {"held_out": True}
            if any(r.held_out for r in reports) and all(r.held_out or r.exhaustive for r in reports)
            else {}
        ),
        **(
            {"exhaustive": [r.index for r in reports if r.exhaustive]}
            if any(r.exhaustive for r in reports)
            else {}
        ),
        **(
            {"gpu_verdict_agreement": round(sum(r.gpu_agree for r in reports) / checks, 4)}
            if (checks := sum(r.gpu_checks for r in reports))
            else {}
        ),
    }


def print_report(reports: list[SketchReport], console: Any) -> None:
    from rich.table import Table

    table = Table(title="feature formulas vs PerStoreFeature (exact mode)")
    for col in ("sketch", "samples", "values", "exact", "max |err|", "unresolved", "build s"):
        table.add_column(col, justify="right")
    table.add_column("held out")
    table.add_column("verified")
    for r in reports:
        table.add_row(
            str(r.index),
            str(r.samples),
            str(r.values),
            f"{r.fraction:.2%}",
            f"{r.max_abs_err:.2e}",
            str(r.unresolved),
            f"{r.build_seconds:.2f}",
            "yes" if r.held_out else "whole space" if r.exhaustive else "NO",
            "yes" if r.verified else "NO",
        )
    console.print(table)
    groups = Table(title="smooth mode at the same integer points: max |smooth − TVM| per group")
    groups.add_column("group")
    groups.add_column("max abs err (log2 space)", justify="right")
    for name, _, _ in GROUPS:
        err = max((r.smooth_err.get(name, 0.0) for r in reports), default=0.0)
        groups.add_row(name, f"{err:.3g}")
    console.print(groups)


def run(path: str, target_spec: str | None, samples: int, seed: int = 0) -> int:
    from rich.console import Console
    from rich.progress import Progress

    if samples < 1:
        raise GradtuneError(f"--samples must be at least 1, got {samples}")
    target = make_target(parse_target(target_spec))
    mod = load_tvmscript(path)
    console = Console(stderr=True)
    _, sketches, _ = design_space(mod, target, seed)
    with Progress(console=console, transient=True) as bar:
        job = bar.add_task("verifying", total=len(sketches) * samples)
        reports = verify_module(mod, target, samples, seed, lambda: bar.advance(job))
    print_report(reports, console)
    result = summary(reports, samples)
    print(json.dumps(result))
    return 0 if result["verified_sketches"] == result["sketches"] and reports else 1
