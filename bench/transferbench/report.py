"""The transfer benchmark's report: a Markdown table, the data as JSON, the summary line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from searchbench.layout import write_json
from searchbench.report import git_commit, machine


def _fmt(value: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def commits_line(data: dict[str, Any]) -> str:
    """Which commits made which kind of run, over every model (runs may span commits)."""
    kinds: dict[str, set[str]] = {}
    for m in data["models"].values():
        for kind, commits in m.get("commits", {}).items():
            kinds.setdefault(kind, set()).update(commits)
    parts = [f"{kind} {', '.join(sorted(c))}" for kind, c in kinds.items() if c]
    return "Runs made at: " + ("; ".join(parts) if parts else "–") + "."


def text(data: dict[str, Any], host: dict[str, Any] | None = None) -> str:
    repeats = sorted({n for m in data["models"].values() for n in m["repeats"].values()})
    lines = [
        "# Transfer-tuning benchmark" + (" (PARTIAL)" if data["partial"] else ""),
        "",
        f"Budget B = {data['budget_s']:g} s per tuning run; runs finished "
        f"{data['runs']['finished']} of {data['runs']['planned']}; full and warm runs per "
        f"model: {'/'.join(map(str, repeats)) or '–'}; warm runs' warm-up "
        f"`{data.get('warm_warmup', 'skip')}` (`gradtune tune --warmup`), source "
        f"`{data.get('warm_from', 'auto')}` (`--from`)"
        + (f", search `{data['warm_config']}`" if data.get("warm_config") else "")
        + f"; rendered at {git_commit()}.",
        commits_line(data),
    ]
    if host is not None:
        lines.append(
            f"CPU {host['cpu']} ({host['logical_cores']} logical cores); target "
            f"`{json.dumps(host['target'])}`."
        )
    lines += [
        "",
        "| model | untuned ms | full ms | transfer ms | warm ms | share of full speedup "
        "| full / transfer time | cold / warm time to cold's final | source (Eq. 1) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in data["models"].items():
        ms = m["ms"]
        ratio = _fmt(m["warm_start_t_ratio"], ".2f", "×")
        repeats = m["warm_start_per_repeat"]
        never = sum(p["bound"] for p in repeats.values())
        if m["warm_start_bound"] and m["warm_start_t_ratio"] is not None:
            ratio += f" (bound: {never} of {len(repeats)} warm starts never reached it)"
        elif never:
            ratio += f" ({never} of {len(repeats)} warm starts never reached it, below the median)"
        source = (m["transfer"] or {}).get("source") or "–"
        lines.append(
            f"| {name} | {_fmt(ms['untuned'], '.3f')} | {_fmt(ms['full'], '.3f')} "
            f"| {_fmt(ms['transfer'], '.3f')} | {_fmt(ms['warm'], '.3f')} "
            f"| {_fmt(m['fraction_of_full_speedup'], '.0%')} | {_fmt(m['time_ratio'], '.1f', '×')} "
            f"| {ratio} | {Path(source).parent.parent.name if '/' in source else source} |"
        )
    leads = [
        f"{name} " + " / ".join(_fmt(v, ".2f", "×") for v in m["warm_lead"].values())
        for name, m in data["models"].items()
        if any(v is not None for v in m["warm_lead"].values())
    ]
    if leads:
        lines += [
            "",
            "The warm start's lead along the way, cold / warm best estimated latency at ¼ / ½ / ¾ "
            "of B (median over repeats): " + "; ".join(leads) + ".",
        ]
    versus = [
        f"{name} {_fmt(m['warm_vs_evolutionary_t_ratio'], '.2f', '×')}"
        + (" (a bound)" if m["warm_vs_evolutionary_bound"] else "")
        + f" over {len(m['warm_vs_evolutionary_per_repeat'])} repeats"
        for name, m in data["models"].items()
        if m.get("warm_vs_evolutionary_per_repeat")
    ]
    if versus:
        lines += [
            "",
            "Against MetaSchedule's evolutionary search (the search benchmark's runs in this work "
            "dir, same budget, repeat and target), its time to its own final estimate over the "
            "warm start's time to that estimate (median over repeats): " + "; ".join(versus) + ".",
        ]
    skipped = [
        f"{name} " + ", ".join(f"r{r} {k}/{n}" for r, (k, n) in sorted(m["warmup_skipped"].items()))
        for name, m in data["models"].items()
        if m.get("warmup_skipped")
    ]
    # No other warm-up skips a batch; results from before the field ran skip.
    if skipped and data.get("warm_warmup", "skip") == "skip":
        lines += [
            "",
            "Tasks whose warm-up batch a warm start skipped (every one with a working program, "
            "its default's or a transferred one), of the model's tasks: "
            + "; ".join(skipped)
            + ".",
        ]
    lines += ["", "Runs:"]
    for name, m in data["models"].items():
        lines.append(f"- {name}: " + ", ".join(f"{k} {v}" for k, v in m["runs"].items()))
    return "\n".join(lines)


def write(data: dict[str, Any], out: Path, stem: str, target: dict | None) -> str:
    """Write ``out/stem.md`` and ``out/stem.json``; returns the Markdown."""
    host = machine(target)
    body = text(data, host)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.md").write_text(body + "\n")
    write_json(out / f"{stem}.json", data | {"machine": host})
    return body
