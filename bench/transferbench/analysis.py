"""The transfer benchmark's metrics, from the saved runs and their interleaved timing.

(a) Transfer only, against full tuning (``gradtune tune`` with budget B; median of its
    repeats), both measured end to end (the model libraries timed interleaved in one
    process):
    - ``fraction_of_full_speedup``: the share of full tuning's gain over untuned that the
      transfer reaches, (untuned/transfer − 1) / (untuned/full − 1): 0 is untuned, 1 is full
      tuning. Computed within each timing pass (``searchbench.timing``: the libraries of a
      pass share its conditions) and its median over the passes taken. None when full tuning
      gained no more than timing noise (``NOISE``): a share of nothing measurable is noise too;
    - ``time_ratio``: full tuning's wall time over the transfer's (library read, Eq. 1 and
      every transferred schedule measured included).
(b) Warm start against cold tuning (the same ``full`` runs), per repeat: cold's final
    latency is its best estimated latency (Σ weight × best measured µs per task) by B; the
    time cold took to first reach it over the time the warm start took (its transfer
    included). A warm start that never reached it within B gives an upper bound
    t_cold / B, marked; the model's ratio is the median over repeats. Beside it, the
    warm start's lead along the way (``warm_lead``): cold / warm best estimate at ¼, ½ and
    ¾ of B, since a warm start ahead all along can still reach cold's last percent late.
(c) Warm start against MetaSchedule's evolutionary search (issue 14's peer), where the
    search-efficiency benchmark's evolutionary runs of the model lie in the same work dir at
    the same budget (``bench/search_efficiency.py --work`` the same directory, default
    layout, default batch) and were tuned for the same target: per repeat, the time the
    evolutionary run took to first reach its own final estimate over the time the warm start
    took to reach it, bounded like (b). A transfer is one of the gradient search's levers:
    this is the ratio of (b) with the peer's run in place of the gradient search's.
"""

from __future__ import annotations

import json
import math
import statistics
from typing import Any

from searchbench.layout import RunSpec
from searchbench.run import estimate_by
from searchbench.timing import passes_of

from transferbench.layout import FINAL, FULL, TRANSFER, UNTUNED, WARM, TransferLayout

NOISE = 0.02  # end-to-end differences below 2% are within a shared machine's timing noise
LEAD_AT = (0.25, 0.5, 0.75)  # shares of B at which the warm start's lead is reported


def first_reached(rounds: list[dict[str, Any]], target_us: float, horizon: float) -> float | None:
    """Wall-clock seconds of the first batch whose estimate is ≤ ``target_us`` (within
    ``horizon``); None if none was."""
    for r in rounds:
        if r["wall_s"] <= horizon and math.isfinite(r["estimated_us"]):
            if r["estimated_us"] <= target_us * (1 + 1e-9):
                return r["wall_s"]
    return None


def warm_lead(cold: dict[str, Any], warm: dict[str, Any], budget: float) -> dict[str, Any]:
    """Cold / warm best estimated latency at each share of ``budget`` in ``LEAD_AT`` (keyed
    by the share); None where either run had no estimate yet."""
    lead = {}
    for share in LEAD_AT:
        c, w = (estimate_by(r["rounds"], share * budget) for r in (cold, warm))
        lead[f"{share:g}"] = c / w if c and w else None
    return lead


def warm_ratio(cold: dict[str, Any], warm: dict[str, Any], budget: float) -> dict[str, Any]:
    """t_cold / t_warm to cold's final estimated latency; ``bound`` when warm never got there.
    ``lead``: ``warm_lead``."""
    target = cold["final_estimated_us"]
    t_cold = first_reached(cold["rounds"], target, budget)
    t_warm = first_reached(warm["rounds"], target, budget)
    entry = {
        "cold_final_us": target,
        "t_cold_s": t_cold,
        "t_warm_s": t_warm,
        "lead": warm_lead(cold, warm, budget),
    }
    if t_cold is None:  # cold never improved on its defaults: nothing to reach
        return entry | {"ratio": None, "bound": False}
    if t_warm is None:
        return entry | {"ratio": t_cold / budget, "bound": True}
    return entry | {"ratio": t_cold / max(t_warm, 1e-3), "bound": False}


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def median_ratio(per_repeat: dict[Any, dict[str, Any]]) -> tuple[float | None, bool]:
    """The median over repeats of ``warm_ratio``'s ratios, and whether that median is a bound.

    A repeat whose warm start never reached cold's final has only a ceiling for its ratio
    (t_cold / B); the median is exact when it stays put wherever below its ceiling that
    ratio truly lies (one never-reached run of three, below the other two, leaves the middle
    one the median)."""
    entries = [(p["ratio"], p["bound"]) for p in per_repeat.values() if p["ratio"] is not None]
    if not entries:
        return None, False
    high = statistics.median(ratio for ratio, _ in entries)
    low = statistics.median(0.0 if bound else ratio for ratio, bound in entries)
    return high, low != high


def evolutionary_runs(layout: TransferLayout, model: str) -> dict[int, dict[str, Any]]:
    """(c)'s references by repeat: the search benchmark's finished evolutionary runs of
    ``model`` in ``layout``'s work dir and budget, with their final estimate by B."""
    from searchbench.layout import Layout

    found = {}
    for r in Layout(layout.work, layout.budget).results(model):
        if r.get("searcher") != "evolutionary" or "error" in r or not r.get("rounds"):
            continue
        if not r.get("per_round_is_default", True):
            continue
        final = estimate_by(r["rounds"], layout.budget)
        if final is not None:
            found[r["repeat"]] = r | {"final_estimated_us": final}
    return found


def model_metrics(layout: TransferLayout, model: str) -> dict[str, Any]:
    """Every metric of one model from its finished runs (None where a run is missing)."""
    results = {r["run_id"]: r for r in layout.results(model)}
    ok = {rid: r for rid, r in results.items() if "error" not in r}
    timing_path = layout.timing(model)
    record = json.loads(timing_path.read_text()) if timing_path.is_file() else None
    passes = passes_of(record) if record else []

    def runs(kind: str) -> list[dict[str, Any]]:
        return sorted((r for r in ok.values() if r["searcher"] == kind), key=lambda r: r["repeat"])

    def latency(kind: str, ms: dict[str, float]) -> float | None:
        """The median over ``kind``'s runs of their libraries' ms in one pass (or record)."""
        return _median([ms[f"{r['run_id']}@{FINAL}"] for r in runs(kind)
                        if f"{r['run_id']}@{FINAL}" in ms])  # fmt: skip

    medians = record["ms"] if record else {}
    untuned, full, transfer, warm = (latency(k, medians) for k in (UNTUNED, FULL, TRANSFER, WARM))
    shares, gains = [], []
    for ms in passes:
        u, f, t = (latency(k, ms) for k in (UNTUNED, FULL, TRANSFER))
        if u and f and t:
            gains.append(u / f)
            shares.append((u / t - 1) / (u / f - 1) if u != f else math.nan)
    fraction = None
    if gains and statistics.median(gains) > 1 + NOISE:
        fraction = statistics.median(x for x in shares if math.isfinite(x))
    full_wall = _median([r["wall_s"] for r in runs(FULL)])
    transfer_runs = runs(TRANSFER)
    transfer_wall = transfer_runs[0]["wall_s"] if transfer_runs else None
    time_ratio = full_wall / transfer_wall if full_wall and transfer_wall else None
    colds = {r["repeat"]: r for r in runs(FULL)}
    per_repeat = {
        w["repeat"]: warm_ratio(colds[w["repeat"]], w, w["budget_s"])
        for w in runs(WARM)
        if w["repeat"] in colds
    }
    ratio, bound = median_ratio(per_repeat)
    peers = evolutionary_runs(layout, model)
    versus_evolutionary = {
        w["repeat"]: warm_ratio(peers[w["repeat"]], w, w["budget_s"])
        for w in runs(WARM)
        if w["repeat"] in peers and peers[w["repeat"]].get("target") == w.get("target")
    }
    evo_ratio, evo_bound = median_ratio(versus_evolutionary)
    source = transfer_runs[0]["transfer"] if transfer_runs else None
    return {
        "ms": {"untuned": untuned, "full": full, "transfer": transfer, "warm": warm},
        "fraction_of_full_speedup": fraction,
        "time_ratio": time_ratio,
        "warm_start_t_ratio": ratio,
        "warm_start_bound": bound,
        "warm_start_per_repeat": per_repeat,
        "warm_vs_evolutionary_t_ratio": evo_ratio,
        "warm_vs_evolutionary_bound": evo_bound,
        "warm_vs_evolutionary_per_repeat": versus_evolutionary,
        "warm_lead": {
            share: _median([x for p in per_repeat.values() if (x := p["lead"][share]) is not None])
            for share in (f"{q:g}" for q in LEAD_AT)
        },
        # Per warm repeat: how many of the model's tasks skipped the warm-up, of how many
        # (runs made before the task scheduler skipped any do not say).
        "warmup_skipped": {
            w["repeat"]: [len(w["warmup_skipped"]), w["tasks"]]
            for w in runs(WARM)
            if "warmup_skipped" in w
        },
        "full_wall_s": full_wall,
        "transfer_wall_s": transfer_wall,
        "transfer": source,
        "runs": {
            rid: ("error: " + r["error"].strip().splitlines()[-1]) if "error" in r else "ok"
            for rid, r in sorted(results.items())
        },  # fmt: skip
        "repeats": {kind: len(runs(kind)) for kind in (FULL, WARM)},
        # The code each kind of run was made by (an adopted full run: the search benchmark's).
        "commits": {
            kind: sorted({r.get("commit", "?") for r in runs(kind)})
            for kind in (UNTUNED, FULL, TRANSFER, WARM)
        },
    }


def gather(layout: TransferLayout, specs: list[RunSpec], models: list[str]) -> dict[str, Any]:
    finished = sum(layout.finished(s) for s in specs)
    return {
        "models": {m: model_metrics(layout, m) for m in models},
        "runs": {"planned": len(specs), "finished": finished},
        "partial": finished < len(specs),
        "budget_s": layout.budget,
        "warm_warmup": layout.warmup,  # the warm runs' task-scheduler warm-up
        "warm_from": layout.warm_from,  # and the library's source they transfer from
        "warm_config": layout.warm_config,  # and their search's GradientConfig over the full's
    }


def _geomean(values: list[float | None]) -> float | None:
    finite = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in finite) / len(finite)) if finite else None


def summary_line(data: dict[str, Any]) -> dict[str, Any]:
    """The last line's JSON object, exactly the keys issue 16 names."""
    keys = ("fraction_of_full_speedup", "time_ratio", "warm_start_t_ratio")
    models = {name: {k: m[k] for k in keys} for name, m in data["models"].items()}
    fractions = [m["fraction_of_full_speedup"] for m in models.values()]
    fractions = [f for f in fractions if f is not None]
    return {
        "models": models,
        "mean_fraction_of_full_speedup": statistics.fmean(fractions) if fractions else None,
        "geomean_time_ratio": _geomean([m["time_ratio"] for m in models.values()]),
        "geomean_warm_start_t_ratio": _geomean([m["warm_start_t_ratio"] for m in models.values()]),
    }
