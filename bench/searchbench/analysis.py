"""The benchmark's metrics, computed from saved run results only (``--render`` reruns this).

Per model, over the runs that finished without error:

- **time to 95%**: the best-known estimated latency is the best any run of the model reached
  within the budget (estimate = Σ task weight × best kernel µs). A run's t95 is the first
  wall-clock time its estimate was within 95% of it (≤ best / 0.95). A run that never got
  there has only a bound, t95 > budget. Per searcher the median over repeats (a bound if the
  median run is one), the ratio evolutionary / gradient, and the range of ratios the extreme
  repeats give. A ratio with a bound on either side is marked (≥ or ≤) and left out of the
  geometric mean, never averaged as if it were a measurement.
- **milestones** (Felix's Table 2): the same for 90% and 99% of the best-known.
- **end-to-end latency** of the model as tuned by ¼, ½ and all of the budget: the median over
  repeats of the interleaved timing (each library's median over the timing passes), and the
  ratio evolutionary / gradient taken within each pass (median of the evolutionary runs'
  libraries over the median of the gradient runs', both from that pass), its median over the
  passes reported with their range.
- **trials per minute** measured within the budget, and each run's wall time and overrun
  (flagged above 5%).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from searchbench.layout import FRACTIONS, SEARCHERS

TARGET_SHARE = 0.95
# Felix's milestones (its Table 2): the time each searcher needs to come within 90%, 95% and
# 99% of the best performance reached in the whole search. t95 is the middle one.
MILESTONES = (0.90, TARGET_SHARE, 0.99)
OVERRUN_LIMIT_PCT = 5.0


def best_curve(result: dict[str, Any], budget: float) -> list[tuple[float, float]]:
    """(wall s, best estimated µs so far) after every batch measured within the budget."""
    out, best = [], math.inf
    for r in result["rounds"]:
        if r["wall_s"] > budget:
            break
        if math.isfinite(r["estimated_us"]):
            best = min(best, r["estimated_us"])
            out.append((r["wall_s"], best))
    return out


def time_to(curve: list[tuple[float, float]], level_us: float) -> float | None:
    return next((t for t, us in curve if us <= level_us), None)


def median_with_bound(values: list[float | None], budget: float) -> tuple[float | None, bool]:
    """(median, is a lower bound): a missing value (never reached) counts as > budget."""
    if not values:
        return None, False
    middle = statistics.median([math.inf if v is None else v for v in values])
    return (budget, True) if math.isinf(middle) else (middle, False)


def ratio_with_bound(
    evo: tuple[float | None, bool], grad: tuple[float | None, bool]
) -> tuple[float | None, str]:
    """(evo / grad, "=" exact, "≥" lower bound, "≤" upper bound, "?" unknown)."""
    (e, e_bound), (g, g_bound) = evo, grad
    if e is None or g is None or (e_bound and g_bound) or g == 0:
        return None, "?"
    return e / g, "≥" if e_bound else "≤" if g_bound else "="


def paired_ratio(
    passes: list[dict[str, float]], numerator: list[str], denominator: list[str]
) -> float:
    """Median over timing passes of (median ms of the ``numerator`` labels / median ms of the
    ``denominator`` labels), both taken within the pass: libraries timed in one pass share its
    conditions, while one library's latency can move by tens of percent between passes."""
    return statistics.median(pass_ratios(passes, numerator, denominator))


def pass_ratios(
    passes: list[dict[str, float]], numerator: list[str], denominator: list[str]
) -> list[float]:
    return [
        statistics.median(p[k] for k in numerator) / statistics.median(p[k] for k in denominator)
        for p in passes
    ]


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _share_key(share: float) -> str:
    return f"{round(share * 100)}"


def run_summary(
    result: dict[str, Any], budget: float, best_us: float | None, timing: list[dict[str, float]]
) -> dict[str, Any]:
    """One run's metrics; ``best_us`` is the best-known estimate its milestones are shares of
    (None: no run of the model measured anything, so none is reached)."""
    curve = best_curve(result, budget)
    builds = result.get("builds", {})
    # Seconds to each of Felix's milestones; t95 is one of them, read from the same place.
    milestones = {
        _share_key(share): time_to(curve, best_us / share) if best_us else None
        for share in MILESTONES
    }
    return {
        "run_id": result["run_id"],
        "searcher": result["searcher"],
        "repeat": result["repeat"],
        "milestones_s": milestones,
        "t95_s": milestones[_share_key(TARGET_SHARE)],
        "best_estimated_us": curve[-1][1] if curve else None,
        "e2e_ms": {
            label: _timed_ms(timing, f"{result['run_id']}@{label}") for label in _fraction_labels()
        },
        "records_at": {label: builds.get(label, {}).get("records") for label in _fraction_labels()},
        "build_errors": {k: b["error"] for k, b in builds.items() if "error" in b},
        "trials_in_budget": result["trials_in_budget"],
        "trials_per_min": round(result["trials_in_budget"] / (budget / 60), 1),
        "wall_s": result["wall_s"],
        "overrun_pct": result["overrun_pct"],
        "over_budget": result["overrun_pct"] > OVERRUN_LIMIT_PCT,
        "records_match_trials": result.get("records_match_trials"),
        "per_round": result["per_round"],
        "search_summary": result.get("search_summary", {}),
        "best_found_by": best_found_by(result),
        "curve": [(round(t, 1), round(us, 2)) for t, us in curve],
    }


def _timed_ms(passes: list[dict[str, float]], label: str) -> float | None:
    """A library's median ms over the passes that timed it (None: never timed)."""
    values = [p[label] for p in passes if label in p]
    return round(statistics.median(values), 5) if values else None


def best_found_by(result: dict[str, Any]) -> dict[str, int] | None:
    """Of a gradient run's tasks, how many got their final best from the descent's picks, how
    many from the explorer's evolution, how many from its random draws of a first batch
    (``random_warmup``), how many from the best-ranked of such draws (``ranked_warmup``) and
    how many from the structural variants among the descent's picks (``structural_variants``),
    by the round whose batch first reached it; None for a run without the gradient search's
    per-round account."""
    best: dict[str, tuple[float, str]] = {}
    for r in result["rounds"]:
        search = r.get("search")
        if search is None:
            continue
        # The descent's best includes its variants': credit them where they reached it.
        descent = search["descent_best_us"]
        variants = search.get("structural_best_us", math.inf)
        for side, us in (
            ("structural" if variants <= descent else "descent", descent),
            (_explore_side(search), search["evolved_best_us"]),
        ):
            if math.isfinite(us) and us < best.get(r["task"], (math.inf, ""))[0]:
                best[r["task"]] = (us, side)
    if not best:
        return None
    sides = [side for _, side in best.values()]
    sides_known = ("descent", "explorer", "random", "ranked", "structural")
    return {side: sides.count(side) for side in sides_known}


def _explore_side(search: dict[str, Any]) -> str:
    if not search.get("sampled"):
        return "explorer"
    return "ranked" if search.get("ranked") else "random"


def _fraction_labels() -> list[str]:
    return [f"{round(f * 100)}" for f in FRACTIONS]


def searcher_summary(runs: list[dict[str, Any]], budget: float) -> dict[str, Any]:
    t95 = [r["t95_s"] for r in runs]
    reached = [t for t in t95 if t is not None]
    median, bound = median_with_bound(t95, budget)
    e2e = {
        label: _median([r["e2e_ms"][label] for r in runs if r["e2e_ms"][label] is not None])
        for label in _fraction_labels()
    }
    return {
        "runs": len(runs),
        # Fractions of the budget by which no run had a record: those builds are untuned.
        "untuned_at": [
            k for k in _fraction_labels() if runs and not any(r["records_at"][k] for r in runs)
        ],  # fmt: skip
        "t95_median_s": median,
        "t95_median_bound": bound,
        "t95_min_s": min(reached) if reached else None,
        # The slowest repeat: a bound when any repeat never got there.
        "t95_max_s": budget if len(reached) < len(t95) else max(reached, default=None),
        "t95_max_bound": len(reached) < len(t95),
        "t95_reached": f"{len(reached)}/{len(t95)}",
        "e2e_ms_median": e2e,
        # Rounded like each run's rate: a median of two is their mean, with float noise.
        "trials_per_min_median": _round(_median([r["trials_per_min"] for r in runs]), 1),
        "max_overrun_pct": max((r["overrun_pct"] for r in runs), default=None),
        "over_budget_runs": [r["run_id"] for r in runs if r["over_budget"]],
        # Summed over the runs that kept the gradient search's per-round account.
        "best_found_by": _sum_counts([r.get("best_found_by") for r in runs]),
    }


def _sum_counts(counts: list[dict[str, int] | None]) -> dict[str, int] | None:
    known = [c for c in counts if c is not None]
    if not known:
        return None
    return {side: sum(c.get(side, 0) for c in known) for side in known[0]}


def ratio_range(evo: list[dict], grad: list[dict], budget: float) -> tuple[list[float], bool]:
    """[fastest evo / slowest grad, slowest evo / fastest grad] over the repeats; the budget
    stands in for a repeat that never got there (then the range is flagged as bounded)."""
    e = [budget if r["t95_s"] is None else r["t95_s"] for r in evo]
    g = [budget if r["t95_s"] is None else r["t95_s"] for r in grad]
    bounded = any(r["t95_s"] is None for r in evo + grad)
    if not e or not g or min(g) == 0 or all(r["t95_s"] is None for r in evo + grad):
        return [], bounded
    return [round(min(e) / max(g), 3), round(max(e) / min(g), 3)], bounded


def analyse_model(
    results: list[dict[str, Any]],
    reference: list[dict[str, Any]],
    timing: list[dict[str, float]],
    budget: float,
) -> dict[str, Any]:
    """Metrics of ``results`` (finished, error-free runs of one model and batch size); the
    best-known latency is taken over ``reference`` (the runs it is compared against).
    ``timing``: the passes of the model's interleaved timing (label → ms each)."""
    finals = [c[-1][1] for c in (best_curve(r, budget) for r in reference) if c]
    # No run measured anything within the budget: every t95 is a bound, the rest still counts.
    best = min(finals, default=None)
    level = best / TARGET_SHARE if best is not None else 0.0
    runs = [run_summary(r, budget, best, timing) for r in results]
    by = {s: [r for r in runs if r["searcher"] == s] for s in SEARCHERS}
    summary = {s: searcher_summary(by[s], budget) for s in SEARCHERS}
    g, e = summary["gradient"], summary["evolutionary"]
    ratio, kind = ratio_with_bound(
        (e["t95_median_s"], e["t95_median_bound"]), (g["t95_median_s"], g["t95_median_bound"])
    )
    span, span_bounded = ratio_range(by["evolutionary"], by["gradient"], budget)
    milestones = {}
    for share in MILESTONES:
        key = _share_key(share)
        times = {s: [r["milestones_s"][key] for r in by[s]] for s in SEARCHERS}
        medians = {k: median_with_bound(v, budget) for k, v in times.items()}
        value, mark = ratio_with_bound(medians["evolutionary"], medians["gradient"])
        milestones[key] = {
            "ratio": round(value, 3) if value is not None else None,
            "kind": mark,
            **{f"{k}_median_s": _round(m[0], 1) for k, m in medians.items()},
            **{f"{k}_median_bound": m[1] for k, m in medians.items()},
            **{f"{k}_reached": f"{sum(t is not None for t in v)}/{len(v)}"
               for k, v in times.items()},
        }  # fmt: skip
    e2e_ratio, e2e_range = {}, {}
    for label in _fraction_labels():
        # Both untuned: the same program twice, the ratio would be timing noise.
        if label in g["untuned_at"] and label in e["untuned_at"]:
            e2e_ratio[label] = e2e_range[label] = None
            continue
        grad, evo = (
            [f"{r['run_id']}@{label}" for r in by[s] if r["e2e_ms"][label] is not None]
            for s in ("gradient", "evolutionary")
        )
        # A ratio needs both sides from one pass: only the passes that timed every library
        # compared count (all of them, unless a run finished after the timing was made).
        full = [p for p in timing if all(k in p for k in grad + evo)]
        if not (grad and evo and full):
            e2e_ratio[label] = e2e_range[label] = None
            continue
        ratios = pass_ratios(full, evo, grad)
        e2e_ratio[label] = round(statistics.median(ratios), 3)
        e2e_range[label] = [round(min(ratios), 3), round(max(ratios), 3)]
    return {
        "best_estimated_us": round(best, 2) if best is not None else None,
        "level_us": round(level, 2) if best is not None else None,
        "searchers": summary,
        "t95_ratio": round(ratio, 3) if ratio is not None else None,
        "t95_ratio_kind": kind,
        "t95_bound": kind != "=",
        "t95_ratio_range": span,
        "t95_ratio_range_bounded": span_bounded,
        "milestones": milestones,
        "e2e_ratio": e2e_ratio,
        "e2e_ratio_at_budget": e2e_ratio["100"],
        # The spread of that ratio over the timing passes (one pass: [r, r]).
        "e2e_ratio_at_budget_passes": e2e_range["100"],
        "timing_passes": len(timing),
        "repeats": min(g["runs"], e["runs"]),
        "runs": runs,
    }
