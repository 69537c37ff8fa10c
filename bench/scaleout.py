"""Scale-out on this machine: trials per minute with 1 and 2 local RPC servers, and two models
retuned concurrently on a local Dask cluster against one after the other.

Protocol (every run a fresh `gradtune` process with the CLI's defaults except what is varied;
repeats interleaved, the order of the two settings alternating per repeat, so drift in the
machine's load hits both alike):

A. **RPC servers.** ``gradtune tune MODEL --time-budget A --trials 5000 --rpc-servers N`` for
   N = 1, 2 on one model (default ``examples/small_cnn.py``: its few tasks finish the warm-up
   round early, so the budget measures steady-state throughput). Trials per
   minute = measured trials / tuning seconds, from the run's ``summary.json``; also the device
   seconds spent timing (``measure_seconds``) per trial.
B. **Dask.** ``gradtune retune --trials T --target '{"kind": "llvm", "num-cores": 1}'`` on two
   small models (``models/mlp_block.py`` and a copy with other weights), each against a fresh
   registry, with ``--dask-workers 2`` (a local cluster, one core per tuning) and with
   ``--dask-workers 1`` (the flow's sequential loop). Wall seconds of the whole command.

    .venv/bin/python bench/scaleout.py [--repeats 3] [--budget 120] [--trials 24]
    .venv/bin/python bench/scaleout.py --render       # re-analyse the saved runs

Resumable: each finished run is a JSON file under ``--work``; a rerun does only what is missing.
Writes ``--out``/scaleout.{md,json}; the last line printed is one JSON object:
``{"trials_per_min": {"1": m1, "2": m2}, "rpc_ratio_2_over_1": r, "dask_seconds":
{"sequential": s, "dask": d}, "dask_speedup": s_over_d, "repeats": n, "commit": c}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from searchbench.layout import add_work_and_out, resolve_out
from searchbench.report import git_commit

from gradtune import machine

ROOT = Path(__file__).resolve().parents[1]
ONE_CORE = json.dumps({"kind": "llvm", "num-cores": 1})


def gradtune(*args: str, log: Path) -> tuple[int, float]:
    """``gradtune ARGS`` in a fresh process; its exit code and wall seconds."""
    start = time.monotonic()
    with log.open("w") as out:
        code = subprocess.run(
            [sys.executable, "-m", "gradtune.cli", *args], cwd=ROOT, stdout=out,
            stderr=subprocess.STDOUT,
        ).returncode  # fmt: skip
    return code, time.monotonic() - start


def rpc_run(work: Path, model: str, servers: int, repeat: int, budget: float) -> dict[str, Any]:
    out = work / "rpc" / f"servers{servers}-r{repeat}"
    code, wall = gradtune(
        "tune", model, "--time-budget", str(budget), "--trials", "5000", "--rpc-servers",
        str(servers), "--seed", str(repeat), "--out", str(out),
        log=work / "logs" / f"{out.name}.log",
    )  # fmt: skip
    if code:
        raise SystemExit(f"scaleout: tune with {servers} RPC server(s) failed (exit {code})")
    summary = json.loads((out / "summary.json").read_text())
    trials, seconds = summary["total_trials"], summary["tuning_seconds"]
    return {
        "servers": servers, "repeat": repeat, "trials": trials, "tuning_seconds": seconds,
        "trials_per_min": 60 * trials / seconds, "wall_s": wall,
        "measure_seconds_per_trial": summary.get("measure_seconds", 0) / max(trials, 1),
    }  # fmt: skip


def two_models(work: Path) -> Path:
    """models/mlp_block.py and a copy with other weights, and a retune config naming both."""
    source = (ROOT / "models" / "mlp_block.py").read_text()
    models = work / "models"
    models.mkdir(parents=True, exist_ok=True)
    (models / "mlp_a.py").write_text(source)
    (models / "mlp_b.py").write_text(source.replace("manual_seed(0)", "manual_seed(1)"))
    config = work / "models.yaml"
    config.write_text("models:\n  - path: models/mlp_a.py\n  - path: models/mlp_b.py\n")
    return config


def dask_run(work: Path, workers: int, repeat: int, trials: int) -> dict[str, Any]:
    name = f"{'dask' if workers > 1 else 'sequential'}-r{repeat}"
    out = work / "dask" / name
    out.mkdir(parents=True, exist_ok=True)  # a fresh registry: both models are tuned
    code, wall = gradtune(
        "retune", "--config", str(two_models(work)), "--mlflow-uri",
        f"sqlite:///{out / 'mlflow.db'}", "--trials", str(trials), "--target", ONE_CORE,
        "--dask-workers", str(workers), "--seed", str(repeat), "--out", str(out / "runs"),
        log=work / "logs" / f"{name}.log",
    )  # fmt: skip
    if code:
        raise SystemExit(f"scaleout: retune with {workers} Dask worker(s) failed (exit {code})")
    return {"workers": workers, "repeat": repeat, "wall_s": wall}


def cached(path: Path, make) -> dict[str, Any]:
    if path.is_file():
        return json.loads(path.read_text())
    before = os.getloadavg()[0]
    result = {**make(), "load_before": before, "commit": git_commit()}
    result["load_after"] = os.getloadavg()[0]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    return result


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} [{min(values):.1f}–{max(values):.1f}]"


def render(work: Path, out: Path) -> dict[str, Any]:
    rpc = [json.loads(p.read_text()) for p in sorted((work / "results" / "rpc").glob("*.json"))]
    dask = [json.loads(p.read_text()) for p in sorted((work / "results" / "dask").glob("*.json"))]
    if not rpc or not dask:
        raise SystemExit(f"scaleout: no finished runs under {work}/results")
    tpm = {n: [r["trials_per_min"] for r in rpc if r["servers"] == n] for n in (1, 2)}
    mps = {n: [r["measure_seconds_per_trial"] for r in rpc if r["servers"] == n] for n in (1, 2)}
    secs = {k: [r["wall_s"] for r in dask if (r["workers"] > 1) == (k == "dask")]
            for k in ("sequential", "dask")}  # fmt: skip
    med = statistics.median
    commits = sorted({r["commit"] for r in rpc + dask})
    loads = [r[k] for r in rpc + dask for k in ("load_before", "load_after")]
    summary = {
        "trials_per_min": {str(n): round(med(v), 1) for n, v in tpm.items()},
        "rpc_ratio_2_over_1": round(med(tpm[2]) / med(tpm[1]), 3),
        "dask_seconds": {k: round(med(v), 1) for k, v in secs.items()},
        "dask_speedup": round(med(secs["sequential"]) / med(secs["dask"]), 3),
        "repeats": min(len(v) for v in [*tpm.values(), *secs.values()]),
        "commit": ", ".join(commits),
    }
    lines = [
        "# Scale-out: RPC servers and Dask workers on this machine",
        "",
        f"Commit {summary['commit']}; {machine.cpu_name()} with "
        f"{os.cpu_count()} logical cores; load average {min(loads):.1f}–{max(loads):.1f} around "
        "the runs. Command: `.venv/bin/python bench/scaleout.py` (protocol in its docstring).",
        "",
        "| RPC servers | trials / min: median [min–max] | device s / trial | runs |",
        "|---|---|---|---|",
        *(f"| {n} | {spread(tpm[n])} | {med(mps[n]):.3f} | {len(tpm[n])} |" for n in (1, 2)),
        "",
        "| two models retuned | wall s: median [min–max] | runs |",
        "|---|---|---|",
        *(f"| {k} | {spread(v)} | {len(v)} |" for k, v in secs.items()),
        "",
        f"- 2 servers / 1 server: **{summary['rpc_ratio_2_over_1']:.2f}×** trials per minute"
        + (", no gain" if summary["rpc_ratio_2_over_1"] < 1.05 else "")
        + ". The limit on this host: the target measures on all of this machine's cores "
        "(num-cores = "
        f"{os.cpu_count()}), so two servers time their candidates at the same time on the same "
        "cores, and the builder's workers compile on them too. More servers pay off when each "
        "has its own device (`--tracker`), not on one 2-core host.",
        f"- Dask local cluster (2 workers, one core per tuning) against the sequential loop: "
        f"**{summary['dask_speedup']:.2f}×** faster. Each tuning measures on its own core "
        "(`num-cores` 1), so the two do not time each other; they still share the memory "
        "system and the build's CPU time, and each model's import, compile and registry work "
        "runs beside the other's.",
    ]
    out.mkdir(parents=True, exist_ok=True)
    (out / "scaleout.md").write_text("\n".join(lines) + "\n")
    (out / "scaleout.json").write_text(json.dumps({"summary": summary, "rpc": rpc, "dask": dask}))
    print("\n".join(lines))
    return summary


DEFAULT_WORK = ROOT / "bench" / "work" / "scaleout"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="examples/small_cnn.py")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget", type=float, default=120.0, help="seconds per tune (part A)")
    parser.add_argument("--trials", type=int, default=24, help="trials per model (part B)")
    add_work_and_out(parser, DEFAULT_WORK)
    parser.add_argument("--render", action="store_true", help="only re-analyse saved runs")
    args = parser.parse_args(argv)
    resolve_out(args, DEFAULT_WORK)
    if args.repeats < 1 or args.budget <= 0 or args.trials < 1:
        parser.error("--repeats, --budget and --trials must be positive")
    if not (ROOT / args.model).is_file():
        parser.error(f"--model {args.model}: no such file")
    work = args.work.resolve()
    (work / "logs").mkdir(parents=True, exist_ok=True)
    if not args.render:
        for repeat in range(args.repeats):
            order = (1, 2) if repeat % 2 == 0 else (2, 1)
            for n in order:
                r = cached(
                    work / "results" / "rpc" / f"servers{n}-r{repeat}.json",
                    lambda n=n, k=repeat: rpc_run(work, args.model, n, k, args.budget),
                )
                print(
                    f"rpc servers={n} r{repeat}: {r['trials_per_min']:.1f} trials/min", flush=True
                )
            for w in order:
                r = cached(
                    work / "results" / "dask" / f"workers{w}-r{repeat}.json",
                    lambda w=w, k=repeat: dask_run(work, w, k, args.trials),
                )
                print(f"dask workers={w} r{repeat}: {r['wall_s']:.1f} s", flush=True)
    summary = render(work, args.out)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
