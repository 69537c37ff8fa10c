"""Turn the saved runs into the results: JSON, a markdown table, one plot per model.

Everything is read back from the work dir, so a partial benchmark (interrupted, or still
running) renders just the same, marked PARTIAL. Each output names the git commit, the machine
and the conditions it was measured under.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path
from typing import Any

from gradtune.machine import cpu_name
from searchbench.analysis import (
    OVERRUN_LIMIT_PCT,
    TARGET_SHARE,
    analyse_model,
    best_curve,
    geomean,
)
from searchbench.layout import SEARCHERS, Layout, RunSpec, write_json
from searchbench.models import ROOT
from searchbench.timing import passes_of

CONDITIONS = (
    "The machine is shared (other jobs may run alongside: see the load averages recorded per "
    "run); runs are interleaved (searchers alternate, models round-robin, repeat-major) so "
    "drift affects both searchers alike, and end-to-end latencies are timed interleaved in one "
    "process."
)


def labels(runs: list[Path]) -> list[str]:
    """A name per directory (a run or a dataset), as the tables print it: the fewest trailing
    path parts that tell them apart. ``vs_runtimes`` leaves every library in
    ``runs/<model>/tune``, and keyed by the last part alone the libraries of one timing
    overwrote each other (as two datasets named ``data`` would in ``label_noise``)."""
    parts = [run.resolve().parts for run in runs]
    for k in range(1, max(map(len, parts), default=1) + 1):
        names = ["/".join(p[-k:]) for p in parts]
        if len(set(names)) == len(names):
            return names
    return [str(run) for run in runs]  # the same directory given twice: keep them as given


def git_commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    # Rendered results under bench/results are not code: they leave the commit clean.
    changed = git("status", "--porcelain", "--", ".", ":!bench/results")
    return f"{commit} dirty" if changed else commit


def machine(target: dict[str, Any] | None) -> dict[str, Any]:
    return {"cpu": cpu_name(), "logical_cores": os.cpu_count(), "target": target}


def conditions(commit: str, m: dict[str, Any]) -> str:
    """The sentence every results file starts with: the code, the CPU and the target."""
    return (
        f"Commit {commit}; CPU {m['cpu']} ({m['logical_cores']} logical cores); target "
        f"`{json.dumps(m['target'])}`."
    )


def batch_of(result: dict[str, Any]) -> int:
    """A run's batch size as planned: 0 for the CLI's default, else the size it was given."""
    return 0 if result["per_round_is_default"] else result["per_round"]


def gather(layout: Layout, specs: list[RunSpec], models: list[str]) -> dict[str, Any]:
    """The results of ``specs`` (the planned runs) as far as they got, analysed per model and
    batch size; the best-known latency of a model is over all its runs in ``specs``."""
    data: dict[str, Any] = {"models": {}, "failed_models": {}, "failed_runs": {}}
    target = None
    finished = failed = planned = 0
    commits: set[str] = set()
    # Runs before gradtune set TVM_NUM_THREADS (1ffb77c) recorded no count: they ran on TVM's
    # default, half the logical CPUs on x86.
    pools: set[str] = set()
    for name in models:
        prepared_path = layout.prepared(name)
        prepared = json.loads(prepared_path.read_text()) if prepared_path.is_file() else None
        if prepared and "error" in prepared:
            data["failed_models"][name] = prepared["error"]
            continue
        target = target or (prepared or {}).get("target")
        mine = [s for s in specs if s.model == name]
        planned += len(mine)
        results = [json.loads(layout.result(s).read_text()) for s in mine if layout.finished(s)]
        finished += len(results)
        commits |= {r.get("commit", "unrecorded") for r in results}
        pools |= {str(r.get("tvm_threads", "unrecorded")) for r in results}
        ok = [r for r in results if "error" not in r]
        for r in results:
            if "error" in r:
                failed += 1
                data["failed_runs"][f"{name}/{r['run_id']}"] = r["error"].splitlines()[-1][:300]
        timing_path = layout.timing(name)
        record = json.loads(timing_path.read_text()) if timing_path.is_file() else None
        timing = passes_of(record) if record else []
        per_rounds = sorted({s.per_round or 0 for s in mine})
        entry: dict[str, Any] = {
            "planned_runs": len(mine),
            "finished_runs": len(results),
        }
        if prepared:
            entry |= {k: prepared[k] for k in (
                "default_per_round", "leaked_workloads", "excluded_by_model",
                "excluded_by_hash_only", "task_hashes_in_training_before",
            )}  # fmt: skip
            entry["tasks"] = len(prepared["tasks"])
            entry["pretraining"] = prepared["pretraining"] | {"weights": prepared["weights"]}
        if record:  # the cross-core state its passes share; older records predate the probe
            entry["timing_state"] = record.get("state", "unprobed")
            entry["timing_passes_run"] = len(record.get("pass_conditions") or timing)
        for per_round in per_rounds:
            subset = [r for r in ok if batch_of(r) == per_round]
            key = "default" if per_round == 0 else str(per_round)
            entry.setdefault("by_per_round", {})[key] = (
                analyse_model(subset, ok, timing, layout.budget) if subset else {}
            )
        data["models"][name] = entry
    data["partial"] = finished < planned
    data["runs"] = {"planned": planned, "finished": finished, "failed": failed}
    # The runs' commits; the render's own is recorded apart (it may be later, or dirty).
    data["commit"] = ", ".join(sorted(commits)) or git_commit()
    data["rendered_at"] = git_commit()
    data["machine"] = machine(target)
    data["tvm_threads"] = ", ".join(sorted(pools)) or "none finished"
    data["budget_s"] = layout.budget
    data["conditions"] = CONDITIONS
    return data


def main_view(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per model, the analysis at the CLI's default batch size (the main benchmark)."""
    return {
        name: entry | entry.get("by_per_round", {}).get("default", {})
        for name, entry in data["models"].items()
    }


def summary_line(data: dict[str, Any]) -> dict[str, Any]:
    view = main_view(data)
    models = {}
    exact, e2e = [], []
    for name, m in view.items():
        if m.get("t95_ratio") is not None and not m["t95_bound"]:
            exact.append(m["t95_ratio"])
        if m.get("e2e_ratio_at_budget"):
            e2e.append(m["e2e_ratio_at_budget"])
        models[name] = {
            "t95_ratio": m.get("t95_ratio"),
            "t95_ratio_range": m.get("t95_ratio_range", []),
            "t95_bound": m.get("t95_bound", True),
            "e2e_ratio_at_budget": m.get("e2e_ratio_at_budget"),
            "e2e_ratio_at_budget_passes": m.get("e2e_ratio_at_budget_passes"),
            "milestone_ratios": {
                k: {"ratio": x["ratio"], "bound": x["kind"] != "="}
                for k, x in m.get("milestones", {}).items()
            },
            "leaked_workloads": m.get("leaked_workloads"),
            "repeats": m.get("repeats", 0),
        }
    g, h = geomean(exact), geomean(e2e)
    return {
        "models": models,
        "geomean_t95_ratio": round(g, 3) if g else None,
        "geomean_e2e_ratio_at_budget": round(h, 3) if h else None,
        "partial": data["partial"],
        "commit": data["commit"],
        "failed_models": sorted(data["failed_models"]),
    }


def _seconds(value: float | None, bound: bool = False) -> str:
    if value is None:
        return "–"
    return f"> {value:.0f}" if bound else f"{value:.0f}"


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def _ratio(value: float | None, kind: str = "=") -> str:
    if value is None:
        return "–"
    return f"{'' if kind == '=' else kind}{value:.2f}"


def _passes(m: dict[str, Any]) -> str:
    """The e2e ratio's range over the timing passes, when there was more than one."""
    span = m.get("e2e_ratio_at_budget_passes")
    if not span or m.get("timing_passes", 1) < 2:
        return ""
    return f" [{span[0]:.2f}–{span[1]:.2f}]"


def table_rows(view: dict[str, dict[str, Any]], failed: dict[str, str]) -> list[str]:
    rows = [
        "| model | tasks | batch | leaked | runs g/e | best est. µs | t95 s grad: median "
        "[min–max] | t95 s evo: median [min–max] | t95 ratio evo/grad [range] | e2e ms grad "
        "¼ / ½ / 1 | e2e ms evo ¼ / ½ / 1 | e2e ratio at budget | trials/min g / e | max "
        "overrun % g / e |",
        "|" + "---|" * 14,
    ]
    for name, m in view.items():
        if "searchers" not in m:
            note = m.get("error") or f"{m.get('finished_runs', 0)} runs finished, none usable"
            rows.append(
                f"| {name} | {m.get('tasks', '–')} | {m.get('default_per_round', '–')} | "
                f"{m.get('leaked_workloads', '–')} | | {note} |" + " |" * 8
            )
            continue
        s = m["searchers"]
        g, e = s["gradient"], s["evolutionary"]

        def t95(x: dict[str, Any]) -> str:
            span = ""
            if x["t95_min_s"] is not None:
                high = _seconds(x["t95_max_s"], x["t95_max_bound"])
                span = f" [{_seconds(x['t95_min_s'])}–{high}]"
            median = _seconds(x["t95_median_s"], x["t95_median_bound"])
            return f"{median}{span} ({x['t95_reached']} reached)"

        def e2e(x: dict[str, Any]) -> str:
            return " / ".join(
                _ms(x["e2e_ms_median"][k]) + (" u" if k in x["untuned_at"] else "")
                for k in ("25", "50", "100")
            )

        def overrun(x: dict[str, Any]) -> str:
            value = x["max_overrun_pct"]
            if value is None:
                return "–"
            return f"**{value:.1f} ⚠**" if value > OVERRUN_LIMIT_PCT else f"{value:.1f}"

        span, span_text = m["t95_ratio_range"], ""
        if span:
            star = "*" if m["t95_ratio_range_bounded"] else ""
            span_text = f"[{span[0]:.2f}–{span[1]:.2f}{star}]"
        rows.append(
            f"| {name} | {m.get('tasks')} | {m.get('default_per_round')} | "
            f"{m.get('leaked_workloads')} | {g['runs']}/{e['runs']} | "
            f"{m['best_estimated_us'] if m['best_estimated_us'] is not None else '–'} | "
            f"{t95(g)} | {t95(e)} | {_ratio(m['t95_ratio'], m['t95_ratio_kind'])} "
            f"{span_text} | {e2e(g)} | {e2e(e)} | "
            f"{_ratio(m['e2e_ratio_at_budget'])}{_passes(m)} | {g['trials_per_min_median']} / "
            f"{e['trials_per_min_median']} | {overrun(g)} / {overrun(e)} |"
        )
    for name, error in failed.items():
        rows.append(f"| {name} | failed: {error.splitlines()[-1][:200]} |" + " |" * 12)
    return rows


def milestone_rows(view: dict[str, dict[str, Any]]) -> list[str]:
    """Felix's milestones: time to 90 / 95 / 99% of the best-known, per searcher (medians)."""
    rows = [
        "",
        "## Milestones: seconds to 90 / 95 / 99% of the best-known estimate (medians, runs "
        "that got there)",
        "",
        "| model | milestone | grad s (reached) | evo s (reached) | ratio evo/grad |",
        "|" + "---|" * 5,
    ]
    for name, m in view.items():
        for label, x in m.get("milestones", {}).items():
            rows.append(
                f"| {name} | {label}% | "
                f"{_seconds(x['gradient_median_s'], x['gradient_median_bound'])} "
                f"({x['gradient_reached']}) | "
                f"{_seconds(x['evolutionary_median_s'], x['evolutionary_median_bound'])} "
                f"({x['evolutionary_reached']}) | {_ratio(x['ratio'], x['kind'])} |"
            )
    return rows if len(rows) > 5 else []


def sweep_rows(data: dict[str, Any]) -> list[str]:
    """The batch-size sweep (models run at more than one batch size), if any."""
    swept = {n: m["by_per_round"] for n, m in data["models"].items()
             if len(m.get("by_per_round", {})) > 1}  # fmt: skip
    if not swept:
        return []
    rows = [
        "",
        "## Batch-size sweep (best known = best of all the model's runs at any batch)",
        "",
        "| model | batch | runs g/e | t95 s grad | t95 s evo | t95 ratio evo/grad | e2e ms "
        "grad / evo at budget | trials/min g / e |",
        "|" + "---|" * 8,
    ]
    for name, by in swept.items():
        for batch, m in by.items():
            if "searchers" not in m:
                continue
            g, e = m["searchers"]["gradient"], m["searchers"]["evolutionary"]
            label = f"{batch} ({data['models'][name].get('default_per_round')})" if (
                batch == "default") else batch  # fmt: skip
            rows.append(
                f"| {name} | {label} | {g['runs']}/{e['runs']} | "
                f"{_seconds(g['t95_median_s'], g['t95_median_bound'])} | "
                f"{_seconds(e['t95_median_s'], e['t95_median_bound'])} | "
                f"{_ratio(m['t95_ratio'], m['t95_ratio_kind'])} | "
                f"{_ms(g['e2e_ms_median']['100'])} / {_ms(e['e2e_ms_median']['100'])} | "
                f"{g['trials_per_min_median']} / {e['trials_per_min_median']} |"
            )
    return rows


def markdown(data: dict[str, Any]) -> str:
    view = main_view(data)
    line = summary_line(data)
    runs = data["runs"]
    head = "# Search efficiency: gradient search vs MetaSchedule's evolutionary search"
    if data["partial"]:
        head += (
            f"\n\n**PARTIAL**: {runs['finished']} of {runs['planned']} planned runs finished; "
            "the numbers below cover only those."
        )
    over = [
        f"{name}/{run}" for name, m in view.items() for s in SEARCHERS
        for run in m.get("searchers", {}).get(s, {}).get("over_budget_runs", [])
    ]  # fmt: skip
    excluded = [n for n, m in view.items() if m.get("t95_bound")]
    lines = [
        head,
        "",
        f"Commit {data['commit']}; CPU {data['machine']['cpu']} "
        f"({data['machine']['logical_cores']} logical cores); target "
        f"`{json.dumps(data['machine']['target'])}`; TVM runtime threads per run: "
        f"{data.get('tvm_threads', 'unrecorded')}; budget {data['budget_s']:g} s per run.",
        "",
        *table_rows(view, data["failed_models"]),
        "",
        f"Geometric mean of the exact t95 ratios: {_ratio(line['geomean_t95_ratio'])}"
        + (f" (bounds left out: {', '.join(excluded)})" if excluded else ""),
        f"Geometric mean of the end-to-end ratios at the budget: "
        f"{_ratio(line['geomean_e2e_ratio_at_budget'])}",
        "",
        "- **Protocol**: each (model, searcher, repeat) tunes from an empty database in a fresh "
        "process with the CLI's settings (`gradtune tune --time-budget B --trials 5000`: "
        "builder, local RPC fleet with one server, gradient task scheduler, all cores, the "
        "default batch in column 'batch'), seed = repeat. Gradient search starts from a cost "
        "model pretrained (params.yaml `pretrain` settings) without any workload of the model "
        "('leaked' = training workloads still sharing a structural hash with it, asserted 0); "
        "evolutionary search uses MetaSchedule's XGBoost from nothing.",
        f"- **Budget**: a timer sets the stop signal at B; only records measured by B count. "
        f"Runs whose wall time exceeded B by more than {OVERRUN_LIMIT_PCT:g}% are bold with ⚠"
        + (f" ({', '.join(over)})" if over else " (none)")
        + "; the overrun is work already under way at B (a generation, batches queued for "
        "building and measuring); the task scheduler starts no batch that its task's last "
        "batch says cannot end by B. A batch counts from when it is joined (its records enter "
        "the database then), which is once it is measured, in the warm-up round too.",
        f"- **t95**: seconds until a run's estimated latency (Σ weight × best kernel µs) came "
        f"within {TARGET_SHARE:.0%} of the best any run of the model reached within B; "
        "'> B' is a bound (never reached), ratios with a bound are marked ≥ / ≤ and left out "
        "of the geometric mean; [range] = fastest evo / slowest grad to slowest evo / fastest "
        "grad (* when a bound stands in).",
        "- **e2e**: the model compiled with the records measured by ¼, ½ and all of B, outputs "
        "verified, all libraries of a model timed interleaved in one process (medians over "
        "repeats); 'u': no run had a record by then, the build is untuned (its spread between "
        "searchers is timing noise). The timing is repeated in passes (each loading the "
        "libraries afresh); ms are medians over them, and the ratio at the budget is taken "
        "within each pass (median evo library over median grad library), its median over "
        "the passes given with their [range] (none: one pass, an older timing). Every round "
        "of a pass is bracketed by a probe of how fast the two cores pass data "
        "(`gradtune.crosscore`: an empty parallel launch of TVM's pool): on a VM whose host "
        "moves its vCPUs apart at times, a pass counts only its rounds in one state, passes "
        "go on until 5 ran with the cores near (at most 15), and a model's passes are of one "
        "state, named per model in the JSON (`timing_state`; 'apart' when no pass saw them "
        "near).",
        f"- **Conditions**: {data['conditions']}",
    ]
    found = {
        name: by for name, m in view.items()
        if (by := m.get("searchers", {}).get("gradient", {}).get("best_found_by"))
    }  # fmt: skip
    if found:
        lines.append(
            "- **Which half of a gradient batch found each task's final best** (descent / "
            "explorer, tasks summed over the repeats that logged it; a third count, where "
            "there is one, is the first batches' random draws, and a fourth their best-ranked "
            "draws): " + ", ".join(_found_by(n, b) for n, b in found.items())
        )
    lines += milestone_rows(view)
    lines += sweep_rows(data)
    if data["failed_runs"]:
        lines += ["", "Failed runs (left out of the numbers):"]
        lines += [f"- {run}: {error}" for run, error in data["failed_runs"].items()]
    return "\n".join(lines) + "\n"


def plot_model(name: str, results: list[dict[str, Any]], entry: dict, budget: float, out: Path):
    """Best estimated latency against wall-clock time, every run of both searchers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"gradient": "tab:blue", "evolutionary": "tab:orange"}
    styles = ["-", "--", ":", "-."]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for r in sorted(results, key=lambda r: (r["searcher"], r["repeat"])):
        style = {"color": colors[r["searcher"]], "linestyle": styles[r["repeat"] % len(styles)]}
        curve = best_curve(r, budget)
        if curve:  # held flat to the budget: that is what the run had at the deadline
            ax.step([t for t, _ in curve] + [budget], [u for _, u in curve] + [curve[-1][1]],
                    where="post", label=f"{r['searcher']} r{r['repeat']}", **style)  # fmt: skip
        # What arrived after the deadline (not counted), faintly.
        late = best_curve(r, math.inf)
        late = [(t, u) for t, u in late if t > budget]
        if late:
            ax.step([t for t, _ in late], [u for _, u in late], where="post", alpha=0.3,
                    label=None if curve else f"{r['searcher']} r{r['repeat']} (after B only)",
                    **style)  # fmt: skip
    if entry.get("level_us"):
        ax.axhline(entry["level_us"], color="grey", linewidth=0.8, linestyle="--",
                   label=f"{TARGET_SHARE:.0%} of best known")  # fmt: skip
    ax.axvline(budget, color="black", linewidth=0.8)
    ax.set_xlim(left=0)
    ax.set_xlabel("tuning wall-clock time (s)")
    ax.set_ylabel("best estimated latency (µs, Σ weight × kernel)")
    ax.set_yscale("log")
    ax.set_title(f"{name}: estimated latency vs tuning time (B = {budget:g} s)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def write(data: dict[str, Any], layout: Layout, specs: list[RunSpec], out: Path, stem: str):
    """``<stem>.json``, ``<stem>.md`` and ``<stem>_<model>.png`` in ``out``; returns the md."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / f"{stem}.json", data | {"summary": summary_line(data)})
    text = markdown(data)
    (out / f"{stem}.md").write_text(text)
    view = main_view(data)
    for name in view:
        runs = {s.run_id for s in specs if s.model == name and s.per_round is None}
        results = [r for r in layout.results(name) if "error" not in r and r["run_id"] in runs]
        if results and not math.isnan(layout.budget):
            plot_model(name, results, view[name], layout.budget, out / f"{stem}_{name}.png")
    return text


def _found_by(name: str, by: dict[str, int]) -> str:
    counts = [by["descent"], by["explorer"]]
    if by.get("random") or by.get("ranked"):
        counts.append(by.get("random", 0))
    if by.get("ranked"):
        counts.append(by["ranked"])
    line = f"{name} " + "/".join(str(c) for c in counts)
    if by.get("structural"):
        line += f" (and {by['structural']} by the descent's structural variants)"
    return line
