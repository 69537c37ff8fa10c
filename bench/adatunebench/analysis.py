"""The ablation's metrics and report, from saved run results only (``--render`` reruns this).

Per model, over the runs that finished without error:

- **best-known**: the best estimated latency (Σ task weight × best kernel µs) any run of any
  configuration reached within the budget; a run's **t95** is when its estimate first came
  within 95% of it (``searchbench.analysis``: never → a bound, > budget);
- **time to the baseline's final latency**: when a run's estimate first reached the median
  estimate the baseline's runs ended the budget with;
- **end-to-end latency** of the model as tuned by the budget, every configuration's libraries
  timed interleaved in one process;
- **device measurement seconds per trial** (``MeasureCost``: what timing the candidates cost
  on the device, over the candidates timed to the end) and **trials per minute**;
- **where the wall clock went**: the shares of a run's wall time spent choosing candidates
  (the search's ``search_s`` per batch: descent, explorer, re-scoring), building and measuring
  them (``measure_s``: hand-over to results), and of that the device's timing itself. The
  adaptive evaluator can only shorten the last.

Per configuration, the median over its runs of each model; ratios between configurations are
per model and then a geometric mean over models (bounds marked and left out).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from searchbench.analysis import best_curve, geomean, median_with_bound, time_to
from searchbench.layout import RunSpec
from searchbench.report import git_commit, machine

from adatunebench.layout import ADAPTIVE_ONLY, BASELINE, FULL, AdaLayout

TARGET_SHARE = 0.95
FINAL = "100"  # the build label of the model as tuned by the whole budget


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(values) if values else None


def run_metrics(result: dict[str, Any], budget: float, timing: dict[str, float]) -> dict:
    curve = best_curve(result, budget)
    candidates = result.get("measured_candidates") or 0
    return {
        "run_id": result["run_id"],
        "curve": curve,
        "best_estimated_us": curve[-1][1] if curve else None,
        "e2e_ms": timing.get(f"{result['run_id']}@{FINAL}"),
        "trials_per_min": result["trials_in_budget"] / (budget / 60),
        "measure_s_per_trial": result["measure_seconds"] / candidates if candidates else None,
        "overrun_pct": result["overrun_pct"],
        **wall_shares(result),
    }


def wall_shares(result: dict[str, Any]) -> dict[str, float | None]:
    """Shares of the run's wall time: choosing its batches, building and measuring them, and
    the device timing within the latter (None for a run without the search's account)."""
    batches = [r["search"] for r in result["rounds"] if r.get("search")]
    wall = result.get("wall_s") or 0.0
    if not batches or wall <= 0:
        return {"search_share": None, "build_measure_share": None, "device_share": None}
    return {
        "search_share": sum(b["search_s"] for b in batches) / wall,
        "build_measure_share": sum(b["measure_s"] for b in batches) / wall,
        "device_share": (result.get("measure_seconds") or 0.0) / wall,
    }


def gather(
    layouts: dict[str, AdaLayout], plan: list[tuple[str, RunSpec]], models: list[str]
) -> dict[str, Any]:
    """Every finished run of ``plan``, analysed per model and configuration."""
    any_layout = next(iter(layouts.values()))
    budget = any_layout.budget
    data: dict[str, Any] = {"models": {}, "failed_runs": {}, "budget_s": budget}
    commits: set[str] = set()
    finished = 0
    target = None
    for model in models:
        prepared_path = any_layout.prepared(model)
        prepared = json.loads(prepared_path.read_text()) if prepared_path.is_file() else {}
        target = target or prepared.get("target")
        timing_path = any_layout.timing(model)
        ms = json.loads(timing_path.read_text())["ms"] if timing_path.is_file() else {}
        per_config: dict[str, list[dict]] = {}
        for config, spec in plan:
            layout = layouts[config]
            if spec.model != model or not layout.finished(spec):
                continue
            result = json.loads(layout.result(spec).read_text())
            finished += 1
            commits.add(result.get("commit", "unrecorded"))
            if "error" in result:
                data["failed_runs"][f"{config}/{model}/{spec.run_id}"] = result["error"][-300:]
                continue
            timing = {k.split("/", 1)[1]: v for k, v in ms.items() if k.startswith(f"{config}/")}
            per_config.setdefault(config, []).append(run_metrics(result, budget, timing))
        bests = [r["best_estimated_us"] for runs in per_config.values() for r in runs]
        best = min((b for b in bests if b is not None), default=None)
        base_final = _median([r["best_estimated_us"] for r in per_config.get(BASELINE, [])])
        entry: dict[str, Any] = {
            "leaked_workloads": prepared.get("leaked_workloads"),
            "best_known_us": best,
            "baseline_final_us": base_final,
            "configs": {},
        }
        for config, runs in per_config.items():
            t95 = [time_to(r["curve"], best / TARGET_SHARE) if best else None for r in runs]
            t_base = [time_to(r["curve"], base_final) if base_final else None for r in runs]
            t95_median, t95_bound = median_with_bound(t95, budget)
            tb_median, tb_bound = median_with_bound(t_base, budget)
            entry["configs"][config] = {
                "runs": len(runs),
                "t95_s": t95_median,
                "t95_bound": t95_bound,
                "t_baseline_final_s": tb_median,
                "t_baseline_final_bound": tb_bound,
                "e2e_ms": _median([r["e2e_ms"] for r in runs]),
                "trials_per_min": _median([r["trials_per_min"] for r in runs]),
                "measure_s_per_trial": _median([r["measure_s_per_trial"] for r in runs]),
                "max_overrun_pct": max(r["overrun_pct"] for r in runs),
                **{
                    key: _median([r[key] for r in runs if r[key] is not None])
                    for key in ("search_share", "build_measure_share", "device_share")
                },
            }
        data["models"][model] = entry
    data["runs"] = {"planned": len(plan), "finished": finished}
    data["partial"] = finished < len(plan)
    data["commit"] = ", ".join(sorted(commits)) or git_commit()
    data["machine"] = machine(target)
    return data


def _ratio(model: dict, key: str, top: str, bottom: str) -> tuple[float | None, bool]:
    """model's ``key`` of ``top`` over ``bottom``, and whether either side is a bound."""
    a, b = model["configs"].get(top, {}), model["configs"].get(bottom, {})
    if a.get(key) is None or not b.get(key):
        return None, False
    return a[key] / b[key], bool(a.get(f"{key[:-2]}_bound") or b.get(f"{key[:-2]}_bound"))


def summary_line(data: dict[str, Any], accuracy: dict[str, Any] | None) -> dict[str, Any]:
    """The last line: per configuration its medians over models, and the issue's ratios."""
    configs: dict[str, dict[str, Any]] = {}
    for name, model in data["models"].items():
        for config, row in model["configs"].items():
            configs.setdefault(config, {})[name] = row

    def across(config: str, key: str) -> float | None:
        return _median([row[key] for row in configs.get(config, {}).values()])

    def geomean_ratio(key: str, top: str, bottom: str) -> tuple[float | None, bool]:
        pairs = [_ratio(m, key, top, bottom) for m in data["models"].values()]
        exact = [r for r, bound in pairs if r is not None and not bound]
        return geomean(exact), any(bound for r, bound in pairs if r is not None)

    # The adaptive evaluator alone isolates its cost; without its runs, the full configuration
    # (which also searches differently, so it times other candidates) stands in, named.
    adaptive_from = ADAPTIVE_ONLY if ADAPTIVE_ONLY in configs else FULL
    fixed, adaptive = (
        across(BASELINE, "measure_s_per_trial"),
        across(adaptive_from, "measure_s_per_trial"),
    )
    t95, t95_bounds = geomean_ratio("t95_s", FULL, BASELINE)
    t_base, t_base_bounds = geomean_ratio("t_baseline_final_s", FULL, BASELINE)
    final, _ = geomean_ratio("e2e_ms", FULL, BASELINE)
    return {
        "configs": {
            config: {
                "models": rows,
                "measure_s_per_trial_median": across(config, "measure_s_per_trial"),
                "trials_per_min_median": across(config, "trials_per_min"),
            }
            for config, rows in configs.items()
        },
        "measure_seconds_ratio": fixed / adaptive if fixed and adaptive else None,
        "measure_seconds_ratio_of": f"{BASELINE} / {adaptive_from}",
        "adaptive_latency_error_median": (accuracy or {}).get("median_abs_error_adaptive"),
        "adaptive_latency_error_source": (accuracy or {}).get("source"),
        "t95_ratio_full_over_baseline": t95,
        "t95_ratio_has_bounds_left_out": t95_bounds,
        "t_baseline_final_ratio_full_over_baseline": t_base,
        "t_baseline_final_has_bounds_left_out": t_base_bounds,
        "final_latency_ratio": final,
        "partial": data["partial"],
        "commit": data["commit"],
    }


def accuracy_check(results_dir: Path) -> dict[str, Any] | None:
    """The adaptive evaluator's accuracy on ≥ 50 candidates against a long fixed measurement:
    ``bench/adaptive_evaluator.py``'s result, named with the commit that measured it."""
    path = results_dir / "adaptive_evaluator.json"
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    summary, conditions = record["summary"], record["conditions"]
    return {
        "median_abs_error_adaptive": summary["median_abs_error"]["adaptive"],
        "candidates": summary["candidates"],
        "source": f"bench/results/adaptive_evaluator.json, {summary['candidates']} candidates, "
        f"commit {conditions['commit']}, 1-min load median {conditions['load1_median']}",
    }


def _fmt(value: float | None, bound: bool = False, digits: int = 1) -> str:
    if value is None:
        return "–"
    return f"{'> ' if bound else ''}{value:.{digits}f}"


def markdown(data: dict[str, Any], summary: dict[str, Any], order: list[str]) -> str:
    status = "PARTIAL: " if data["partial"] else ""
    lines = [
        "# AdaTune ablation: gradient search with an ensemble, EI, contextual ε and adaptive "
        "measurement",
        "",
        f"{status}{data['runs']['finished']} of {data['runs']['planned']} runs; commit "
        f"{data['commit']}; CPU {data['machine']['cpu']} ({data['machine']['logical_cores']} "
        f"logical cores); budget {data['budget_s']:g} s per run.",
        "",
        "| model | config | runs | t95 s | t to baseline's final s | e2e ms at budget | "
        "trials/min | device s per trial | max overrun % |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, model in data["models"].items():
        for config in order:
            row = model["configs"].get(config)
            if row is None:
                continue
            lines.append(
                f"| {name} | {config} | {row['runs']} | {_fmt(row['t95_s'], row['t95_bound'])} | "
                f"{_fmt(row['t_baseline_final_s'], row['t_baseline_final_bound'])} | "
                f"{_fmt(row['e2e_ms'], digits=3)} | {_fmt(row['trials_per_min'])} | "
                f"{_fmt(row['measure_s_per_trial'], digits=4)} | {_fmt(row['max_overrun_pct'])} |"
            )
    lines += [
        "",
        f"- Device measurement seconds per trial, fixed / adaptive "
        f"({summary.get('measure_seconds_ratio_of', 'baseline / adaptive_only')}, median over "
        f"models): {_fmt(summary['measure_seconds_ratio'], digits=2)}.",
        f"- t95, full / baseline (geomean over models, bounds left out): "
        f"{_fmt(summary['t95_ratio_full_over_baseline'], digits=2)}; time to the baseline's "
        f"final latency, full / baseline: "
        f"{_fmt(summary['t_baseline_final_ratio_full_over_baseline'], digits=2)}.",
        f"- End-to-end latency at the budget, full / baseline: "
        f"{_fmt(summary['final_latency_ratio'], digits=3)}.",
        f"- Adaptive evaluator's median latency error against long fixed measurements: "
        f"{_fmt(summary['adaptive_latency_error_median'], digits=4)} "
        f"({summary['adaptive_latency_error_source'] or 'run bench/adaptive_evaluator.py'}).",
    ]
    lines += [
        "",
        "Where the wall clock went (median shares of a run's wall time): choosing candidates "
        "(descent, explorer, re-scoring) / building and measuring them / of which the device "
        "timing them.",
        "",
        "| model | config | search | build + measure | device timing |",
        "|---|---|---|---|---|",
    ]
    for name, model in data["models"].items():
        for config in order:
            row = model["configs"].get(config)
            if row is not None and row.get("search_share") is not None:
                lines.append(
                    f"| {name} | {config} | {row['search_share']:.0%} | "
                    f"{row['build_measure_share']:.0%} | {row['device_share']:.0%} |"
                )
    if data["failed_runs"]:
        lines += ["", "Failed runs:"] + [f"- {k}: {v}" for k, v in data["failed_runs"].items()]
    return "\n".join(lines) + "\n"


def plot(data: dict[str, Any], layouts: dict[str, AdaLayout], plan, out: Path) -> list[Path]:
    """Per model, every run's best estimated latency over time, one colour per configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.parent.mkdir(parents=True, exist_ok=True)
    written = []
    for model in data["models"]:
        fig, ax = plt.subplots(figsize=(7, 4))
        colours = dict(zip(layouts, plt.cm.tab10.colors, strict=False))
        labelled = set()
        for config, spec in plan:
            layout = layouts[config]
            if spec.model != model or not layout.finished(spec):
                continue
            result = json.loads(layout.result(spec).read_text())
            curve = best_curve(result, layout.budget) if "error" not in result else []
            if curve:
                t, us = zip(*curve, strict=True)
                label = None if config in labelled else config
                labelled.add(config)
                ax.step(t, us, where="post", color=colours[config], alpha=0.8, label=label)
        ax.set_xlabel("wall-clock s")
        ax.set_ylabel("estimated model latency µs")
        ax.set_yscale("log")
        ax.set_title(f"{model}: best estimated latency so far")
        ax.legend()
        fig.tight_layout()
        path = out.with_name(f"{out.stem}_{model}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
