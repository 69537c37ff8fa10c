"""Felix's headline experiment on this CPU: gradient search vs MetaSchedule's evolutionary
search, same builder, RPC runner, batch size, gradient task scheduler and wall-clock budget.

For each benchmark model (examples/: ResNet-18-like, MobileNetV2-like, Transformer encoder,
DCGAN-like generator) both searchers tune from an empty database, one after the other (the
order alternates between models so drift on the shared machine hits both). The curve is the
best *estimated* end-to-end latency (Σ task weight × best measured kernel) against tuning
time; at the end both databases are compiled and the real models timed interleaved.

    .venv/bin/python bench/search_efficiency.py [--minutes 5] [--models resnet18_like ...]

Writes bench/results/search_efficiency_<model>.png, search_efficiency.md and .json, and
prints as its last line {"models": {name: {"t95_ratio": r, ...}}, "geomean_t95_ratio": g}
(ratio = evolutionary's time to 95% of the best latency either found / gradient's).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("resnet18_like", "mobilenetv2_like", "transformer_encoder", "dcgan_like")
SEARCHERS = ("gradient", "evolutionary")
WEIGHTS = Path(tempfile.gettempdir()) / f"gradtune-bench-weights-{os.getpid()}.pt"


def time_to(curve: list[tuple[float, float]], target_us: float) -> float | None:
    for seconds, us in curve:
        if us <= target_us:
            return seconds
    return None


def run_model(name: str, minutes: float, per_round: int, tracker, order: tuple, work: Path):
    from gradtune import compilation
    from gradtune.frontend import load_model
    from gradtune.partition import partition
    from gradtune.search import make_strategy
    from gradtune.target import make_target, parse_target
    from gradtune.tune import run_database, tune

    target = make_target(parse_target("llvm"))
    model = load_model(ROOT / "examples" / f"{name}.py")
    fused, tasks = partition(model.mod, model.params, target)
    out = {"tasks": len(tasks)}
    for searcher in order:
        curve: list[tuple[float, float]] = []
        work_dir = work / f"{name}-{searcher}"
        extra = {}
        if searcher == "gradient" and WEIGHTS.is_file():
            from gradtune.costmodel.online import OnlineCostModel

            # A fresh copy of the weights snapshotted at start (online fine-tuning mutates it;
            # a retrained bundled file mid-run must not change the experiment).
            extra["cost_model"] = OnlineCostModel.default(target.kind.name, path=WEIGHTS)
        strategy = make_strategy(searcher, target.kind.name, **extra)
        result = tune(
            tasks, target, work_dir, tracker, max_trials=100_000, time_budget=60 * minutes,
            search=strategy, trials_per_round=per_round,
            on_round=lambda r, c=curve: c.append((r.seconds, r.estimated_model_us))
            if math.isfinite(r.estimated_model_us) else None,
        )  # fmt: skip
        entry = {
            "trials": result.trials,
            "seconds": round(result.seconds, 1),
            "curve": [(round(s, 2), round(u, 2)) for s, u in curve],
        }
        if result.search_summary is not None:
            searched = [r.search for r in result.rounds if r.search is not None]
            entry["fallback_tasks"] = len(result.search_summary.fallback_tasks)
            entry["nan_seeds"] = result.search_summary.nan_seeds
            entry["mean_search_s"] = round(
                sum(s.search_s for s in searched) / max(1, len(searched)), 2
            )
            entry["cost_model"] = result.search_summary.cost_model
        out[searcher] = entry
    executables = {
        s: compilation.build(fused, target, run_database(work / f"{name}-{s}")) for s in order
    }
    runners = {s: compilation.Runner(e, target, model.inputs) for s, e in executables.items()}
    for s, runner in runners.items():
        compilation.verify(runner.outputs(), model.reference_outputs, f"{name} tuned by {s}")
    latency = compilation.time_interleaved({s: r.run for s, r in runners.items()})
    for s in order:
        out[s]["final_e2e_ms"] = round(latency[s], 4)
    return out


def analyse(name: str, data: dict) -> dict:
    best = min(min((u for _, u in data[s]["curve"]), default=math.inf) for s in SEARCHERS)
    row = {"best_estimated_us": round(best, 2)}
    for pct in (90, 95, 99):
        times = {s: time_to(data[s]["curve"], best / (pct / 100)) for s in SEARCHERS}
        row[f"t{pct}"] = times
        g, e = times["gradient"], times["evolutionary"]
        horizon = max(data[s]["seconds"] for s in SEARCHERS)
        # A searcher that never got there is charged the whole budget (a lower bound).
        ratio = (e if e is not None else horizon) / (g if g is not None else horizon)
        row[f"t{pct}_ratio"] = round(ratio, 3)
        # Which way the charged budget biases the ratio: up to "≥" when only evolutionary
        # missed, down to "≤" when only gradient did.
        row[f"t{pct}_bound"] = "≥" if e is None and g else "≤" if g is None and e else "="
    # Both reach the worse of the two final latencies, so this ratio is never capped by the
    # budget: how much sooner one searcher got to where the other ended.
    finals = [min((u for _, u in data[s]["curve"]), default=math.inf) for s in SEARCHERS]
    level = max(finals)
    times = {s: time_to(data[s]["curve"], level) for s in SEARCHERS}
    row["t_match"] = {"level_us": round(level, 2), **times}
    g, e = times["gradient"], times["evolutionary"]
    row["t_match_ratio"] = round(e / g, 3) if g and e else None
    equal = min(data[s]["seconds"] for s in SEARCHERS)
    # Every task must have a measurement before the estimate is finite: the curve starts at
    # the end of the warm-up round, which caps what a time-to-X ratio can show.
    row["warmup_s"] = {s: data[s]["curve"][0][0] if data[s]["curve"] else None for s in SEARCHERS}
    for s in SEARCHERS:
        at = [u for t, u in data[s]["curve"] if t <= equal]
        row[f"{s}_us_at_equal_time"] = round(min(at), 2) if at else None
        row[f"{s}_final_e2e_ms"] = data[s]["final_e2e_ms"]
        row[f"{s}_trials"] = data[s]["trials"]
    return row


def plot(name: str, data: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for s in SEARCHERS:
        curve = data[s]["curve"]
        if curve:
            ax.step([t for t, _ in curve], [u for _, u in curve], where="post", label=s)
    ax.set_xlabel("tuning time (s)")
    ax.set_ylabel("best estimated latency (µs)")
    ax.set_yscale("log")
    ax.set_title(f"{name}: best latency vs tuning time")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def cost_model_provenance() -> dict:
    """Which pretrained weights the gradient search started from (file hash + training data)."""
    import hashlib

    from gradtune.costmodel.online import bundled_path

    path = bundled_path("llvm")
    if not path.is_file():
        return {"source": "random init"}
    shutil.copyfile(path, WEIGHTS)
    info = json.loads(path.with_suffix(".json").read_text())
    return {"sha1": hashlib.sha1(path.read_bytes()).hexdigest()} | {
        k: info.get(k) for k in ("workloads", "records", "loss", "epochs", "date")
    }


def report(meta: dict, raw: dict, rows: dict, out: Path) -> None:
    """Writes search_efficiency.md and prints the table, then the JSON summary line."""
    ratios = [r["t95_ratio"] for r in rows.values() if r["t95_ratio"] > 0]
    geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if ratios else None
    lines = [
        "| model | tasks | best est. µs | warm-up s grad / evo | t95 s grad / evo | "
        "t90 / t95 / t99 ratio (evo/grad) | to the worse final: µs, s grad / evo, ratio | "
        "µs at equal time grad / evo | e2e ms grad / evo | trials grad / evo | "
        "search s per round (grad) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def ratio(r: dict, pct: int) -> str:
        bound = r.get(f"t{pct}_bound", "=")
        return f"{'' if bound == '=' else bound}{r[f't{pct}_ratio']}"

    for name, r in rows.items():
        t95, warm, match = r["t95"], r.get("warmup_s", {}), r.get("t_match", {})
        never = "never"
        lines.append(
            f"| {name} | {raw[name]['tasks']} | {r['best_estimated_us']} | "
            f"{warm.get('gradient')} / {warm.get('evolutionary')} | "
            f"{t95['gradient'] or never} / {t95['evolutionary'] or never} | "
            f"{ratio(r, 90)} / {ratio(r, 95)} / {ratio(r, 99)} | "
            f"{match.get('level_us')}, {match.get('gradient')} / {match.get('evolutionary')}, "
            f"{r.get('t_match_ratio')} | "
            f"{r['gradient_us_at_equal_time']} / {r['evolutionary_us_at_equal_time']} | "
            f"{r['gradient_final_e2e_ms']} / {r['evolutionary_final_e2e_ms']} | "
            f"{r['gradient_trials']} / {r['evolutionary_trials']} | "
            f"{raw[name]['gradient'].get('mean_search_s')} |"
        )
    lines.append(f"\ngeomean t95 ratio: {geomean:.3f}" if geomean else "\ngeomean t95 ratio: -")
    matched = [r["t_match_ratio"] for r in rows.values() if r.get("t_match_ratio")]
    match_geomean = math.exp(sum(map(math.log, matched)) / len(matched)) if matched else None
    if match_geomean:
        lines.append(f"\ngeomean ratio of times to the worse final: {match_geomean:.3f}")
    lines.append(
        "\nA searcher that never reached the level is charged the whole budget: ≥ marks a ratio "
        "that is a lower bound (only evolutionary missed), ≤ an upper bound (only gradient "
        "missed). The curves start when every task has a measurement (warm-up). 'To the "
        "worse final': seconds each searcher took to reach the latency the worse of the two "
        "ended at, and their ratio (evo/grad), which the budget never caps."
    )
    lines.append(
        f"\nBudget {meta['minutes']} min per searcher and model, {meta['trials_per_round']} "
        f"trials per round; gradient search's pretrained cost model: {meta['cost_model']}"
    )
    (out / "search_efficiency.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    summary = {
        n: {
            k: r.get(k)
            for k in ("t90_ratio", "t95_ratio", "t99_ratio", "t95_bound", "t_match_ratio")
        }
        for n, r in rows.items()
    }
    print(
        json.dumps(
            {"models": summary, "geomean_t95_ratio": geomean, "geomean_match_ratio": match_geomean}
        )
    )


def main() -> None:
    from gradtune.measure.rpc_fleet import LocalFleet

    parser = argparse.ArgumentParser()
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--minutes", type=float, default=5.0, help="tuning budget per searcher")
    parser.add_argument("--trials-per-round", type=int, default=8)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    parser.add_argument(
        "--resume", action="store_true", help="keep the models already in the results JSON"
    )
    parser.add_argument(
        "--render", action="store_true", help="only re-analyse the saved JSON into the table"
    )
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    saved = out / "search_efficiency.json"
    if args.render:
        kept = json.loads(saved.read_text())
        rows = {name: analyse(name, data) for name, data in kept["raw"].items()}
        report(kept["meta"], kept["raw"], rows, out)
        return
    work = Path(tempfile.mkdtemp(prefix="gradtune-bench-"))
    raw, rows = {}, {}
    meta = {"minutes": args.minutes, "trials_per_round": args.trials_per_round,
            "cost_model": cost_model_provenance()}  # fmt: skip
    if args.resume and saved.is_file():
        kept = json.loads(saved.read_text())
        if kept.get("meta") != meta:
            # Models tuned under another budget or from other weights are not comparable.
            raise SystemExit(
                f"search_efficiency: --resume refused: {saved} was run with {kept.get('meta')}, "
                f"this run would use {meta}"
            )
        raw = {m: kept["raw"][m] for m in args.models if m in kept.get("raw", {})}
        rows = {m: kept["rows"][m] for m in raw}
    try:
        with LocalFleet() as tracker:
            for i, name in enumerate(args.models):
                if name in raw:
                    continue
                order = SEARCHERS if i % 2 == 0 else SEARCHERS[::-1]
                start = time.perf_counter()
                raw[name] = run_model(
                    name, args.minutes, args.trials_per_round, tracker, order, work
                )
                rows[name] = analyse(name, raw[name])
                plot(name, raw[name], out / f"search_efficiency_{name}.png")
                print(f"{name}: {json.dumps(rows[name])} ({time.perf_counter() - start:.0f} s)",
                      flush=True)  # fmt: skip
                # After every model: an interrupted run resumes with --resume.
                saved.write_text(json.dumps({"meta": meta, "raw": raw, "rows": rows}, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    saved.write_text(json.dumps({"meta": meta, "raw": raw, "rows": rows}, indent=1))
    report(meta, raw, rows, out)


if __name__ == "__main__":
    main()
