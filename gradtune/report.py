"""The tuning report: summary.json (machine-readable), report.md and a latency-vs-time plot.

report.md holds the end-to-end latencies, the peers (what a user would deploy instead), the
task table and the roofline (``gradtune.roofline``), all read from the summary.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .partition import TuningTask
from .search.session import RoundLog


def task_table_rows(
    tasks: list[TuningTask],
    best_us: dict[str, float] | None = None,
    defaults: frozenset[str] | set[str] = frozenset(),
) -> list[list[str]]:
    """Rows of the task table; with ``best_us`` a tuned column, in which a task whose default
    schedule stayed fastest (``defaults``) is marked: it compiles untuned."""
    total = sum(t.untuned_total_us for t in tasks if math.isfinite(t.untuned_us)) or math.nan
    rows = []
    for t in tasks:
        share = t.untuned_total_us / total if math.isfinite(t.untuned_us) else math.nan
        row = [
            t.name,
            t.kernel_class,
            str(t.weight),
            f"{t.flops / 1e6:.2f}",
            f"{t.untuned_us:.1f}",
            f"{100 * share:.1f}%" if math.isfinite(share) else "n/a",
        ]
        if best_us is not None:
            best = best_us.get(t.name, math.nan)
            cell = f"{best:.1f}" if math.isfinite(best) else "-"
            row.append(f"{cell} (default kept)" if t.name in defaults else cell)
        rows.append(row)
    return rows


TASK_HEADER = ["task", "kernel class", "weight", "MFLOPs", "untuned µs", "share"]


def md_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def fmt(value: float | None, spec: str = ".1f", scale: float = 1.0) -> str:
    return "–" if value is None else format(value * scale, spec)


def steady_line(timing: dict[str, Any]) -> list[str]:
    """Which timed rounds the medians are of, unless all ran with the cores near
    (``crosscore``)."""
    if not timing.get("link_ns") or (
        timing["state"] == "near" and timing["kept_rounds"] == timing["rounds"]
    ):
        return []
    low, high = timing["link_ns"]
    probe = f"an empty parallel launch of TVM's pool took {low} to {high} ns"
    if timing.get("near_ns") and timing["near_ns"] < low:  # the machine's fastest, not this run's
        probe += f", {timing['near_ns']} ns at this machine's fastest"
    kept = f"The medians are of the {timing['kept_rounds']} of {timing['rounds']} rounds"
    return [
        {
            "near": f"{kept} in which the cores passed data at their fastest ({probe}; slower, as"
            " when a virtual machine's host moves its vCPUs apart, in the others).",
            "apart": f"{kept} in which the cores passed data slower than at their fastest"
            f" ({probe}), as when a virtual machine's host moves its vCPUs apart: every"
            " contender runs slower then, each by its own factor.",
        }.get(
            timing["state"],
            f"The cores passed data at changing speeds throughout ({probe}): the medians mix both.",
        )
    ]


def peer_lines(summary: dict[str, Any]) -> list[str]:
    """The peers' table: what a user would deploy instead, timed beside the tuned model."""
    peers = summary.get("peers") or {}
    if not peers:
        return []
    lines = [
        "## Against what you would deploy instead",
        "",
        f"Each peer ran on {summary['peer_threads']} threads (`torch.set_num_threads`, ONNX"
        " Runtime's `intra_op_num_threads`) and the tuned model on"
        f" {summary.get('tvm_threads') or '?'} (TVM's runtime, `TVM_NUM_THREADS`; its kernels are"
        " compiled for the target's `num-cores`), timed interleaved in one process. Ratio = tuned"
        " ms / peer ms: below 1 the tuned model is faster.",
        *steady_line(summary.get("timing") or {}),
        "",
        "| peer | ms | tuned / peer | why not run |",
        "|---|---:|---:|---|",
    ]
    for name, p in peers.items():
        error = (p["error"] or "").replace("|", "/").replace("\n", " ")
        lines.append(
            f"| {name} | {fmt(p['ms'], '.3f')} | {fmt(p['ratio_vs_tuned'], '.2f')} | {error} |"
        )
    return [*lines, ""]


def roofline_lines(summary: dict[str, Any]) -> list[str]:
    """The roofline tables: each task against the machine's peak, ONNX Runtime per group."""
    roof = summary.get("roofline")
    if not roof:
        return []
    peak = roof["peak"]
    lines = ["## Where the time goes", ""]
    if peak:
        load = peak.get("load_average")
        lines += [
            f"Machine peak: {peak['gflops']:.0f} GFLOPS fp32, {peak['gbps']:.1f} GB/s"
            f" ({peak['method']}; measured {peak['measured']} on {peak['cpu']}"
            + (f", load average {load[0]:.1f}" if load else "")
            + "; cached per CPU and thread count: delete ~/.cache/gradtune/peak.json to measure"
            " again).",
            "",
        ]
    else:
        lines += ["No peak: the target is not this CPU.", ""]
    lines += [
        "Per call at the tuned latency. Bytes moved: "
        + roof["bytes"]
        + ". The roofline share is the larger of the FLOPS and bandwidth shares (the fraction"
        " of min(peak FLOPS, intensity × peak GB/s) reached).",
        "",
        "| task | group | calls | MFLOP | tuned µs | GFLOPS | % peak FLOPS | KB moved (≥) "
        "| GB/s | % peak GB/s | % roofline |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in roof["tasks"]:
        cells = [
            r["task"], r["group"], str(r["calls"]), f"{r['mflop']:.2f}", fmt(r["tuned_us"]),
            fmt(r["gflops"]), fmt(r["peak_flops_share"], ".1f", 100), f"{r['bytes'] / 1024:.1f}",
            fmt(r["gbps"]), fmt(r["peak_bw_share"], ".1f", 100),
            fmt(r["roofline_share"], ".1f", 100),
        ]  # fmt: skip
        lines.append(md_row(cells))
    lines += [
        "",
        f"ONNX Runtime against the tuned kernels by operator group ({roof['peer_mapping']}):",
        "",
        md_row(["group", "TVM tasks", "tuned µs (Σ calls × µs)", "ONNX Runtime µs", "operators"]),
        "|---|---:|---:|---:|---|",
    ]
    for g in roof["groups"]:
        cells = [g["group"], str(g["tasks"]), f"{g['tuned_us']:.1f}", fmt(g["ort_us"])]
        lines.append(md_row([*cells, ", ".join(g["ort_ops"])]))
    groups = roof["groups"]
    ort_total = (
        None if any(g["ort_us"] is None for g in groups) else sum(g["ort_us"] for g in groups)
    )
    total = sum(g["tuned_us"] for g in groups)
    lines.append(md_row(["**all**", str(len(roof["tasks"])), f"{total:.1f}", fmt(ort_total), ""]))
    return [*lines, ""]


def plot_progress(rounds: list[RoundLog], untuned_us: float, path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    if rounds:
        xs = [0.0] + [r.seconds for r in rounds]
        ys = [untuned_us / 1e3] + [r.estimated_model_us / 1e3 for r in rounds]
        ax.step(xs, ys, where="post", marker="o", markersize=3, label="Σ weight × best kernel")
    ax.axhline(untuned_us / 1e3, color="grey", linestyle="--", label="untuned kernels")
    ax.set_xlabel("tuning time (s)")
    ax.set_ylabel("estimated kernel time per inference (ms)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def budget_warning(summary: dict[str, Any]) -> str | None:
    """Why most kernels are barely tuned, when the time budget ended the run in the warm-up.

    MetaSchedule's task scheduler gives every task one batch before it returns to the slowest,
    whatever the task's share of the latency: with a dozen tasks, batches of 25 and ~1 s a
    trial on 2 cores, that warm-up is most of a 480 s budget. None unless the budget stopped
    the run with more than half the tasks measured in one batch at most."""
    batches = summary.get("batches_per_task")
    if not summary.get("stopped_by_time_budget") or batches is None:
        return None
    tasks = summary["tasks"]
    once = tasks - sum(1 for n in batches.values() if n >= 2)
    if 2 * once <= tasks:
        return None
    return (
        f"The time budget ended the run while {once} of {tasks} tasks had been measured in one"
        " batch at most (every task gets a batch before the search returns to the slowest), so"
        " their kernels are barely tuned: a larger --time-budget tunes them further."
    )


def confirm_lines(summary: dict[str, Any]) -> list[str]:
    """What the confirmation did, when it ran: the tuned column is then its quiet timing."""
    if "confirmed_tasks" not in summary:
        return []
    return [
        "",
        f"Before compiling, the few fastest records of {summary['confirmed_tasks']} tasks and"
        f" their defaults were timed again, quietly ({summary['confirm_seconds']:.0f} s); the"
        " quietly fastest ships, another program than the search's recorded best in"
        f" {summary['confirmed_changed']} (`confirmed.json`). 'tuned µs' is that quiet timing.",
    ]


def write_report(
    out_dir: Path,
    summary: dict[str, Any],
    tasks: list[TuningTask],
    rounds: list[RoundLog],
    best_us: dict[str, float],
) -> list[Path]:
    untuned_kernels = sum(t.untuned_total_us for t in tasks if math.isfinite(t.untuned_us))
    device = summary["target"].get("mcpu", summary["target"]["kind"])
    title = f"{Path(summary['model']).name} on {device}"
    png = plot_progress(rounds, untuned_kernels, out_dir / "tuning_curve.png", title)
    header = [*TASK_HEADER, "tuned µs"]
    table = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    defaults = set(summary.get("default_schedule_tasks", []))
    table += ["| " + " | ".join(r) + " |" for r in task_table_rows(tasks, best_us, defaults)]
    lines = [
        f"# gradtune report: {summary['model']}",
        "",
        f"- target: `{json.dumps(summary['target'])}`",
        f"- search: {summary['search']}; trials this run: {summary['trials']}"
        f" (+{summary['resumed_trials']} resumed); tuning time {summary['tuning_seconds']:.1f} s",
        f"- registered: `{summary['registered']}` at `{summary['mlflow_uri']}`",
        *([f"- **budget:** {warning}"] if (warning := budget_warning(summary)) else []),
        "",
        "## End-to-end latency (median of interleaved repeats)",
        "",
        "| | ms | speedup vs untuned |",
        "|---|---|---|",
        f"| untuned TVM | {summary['untuned_ms']:.3f} | 1.00× |",
        f"| tuned TVM | {summary['tuned_ms']:.3f} | {summary['speedup_vs_untuned']:.2f}× |",
        f"| {summary['reference']} | {summary['reference_ms']:.3f} |"
        f" {summary['untuned_ms'] / summary['reference_ms']:.2f}× |",
        "",
        f"Numerics: max abs error vs {summary['reference']} {summary['max_abs_err']:.3g}.",
        "",
        *peer_lines(summary),
        "## Tasks",
        "",
        "Each task's default schedule is measured like every candidate; where none beat it, the"
        " default is compiled in (marked 'default kept').",
        *confirm_lines(summary),
        "",
        *table,
        "",
        *roofline_lines(summary),
        "## Progress",
        "",
        f"![best latency vs tuning time]({png.name})",
        "",
    ]
    md = out_dir / "report.md"
    md.write_text("\n".join(lines))
    return [md, png]
