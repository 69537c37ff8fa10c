"""Tuned and deployed on half the cores, or on all of them: what TVM's default thread count costs.

Without ``TVM_NUM_THREADS``, TVM's runtime takes half of ``hardware_concurrency()`` on x86 (it
assumes hyper-threads): one thread on a 2-core VM without SMT. Until gradtune set the count to
the target's ``num-cores`` (``gradtune/threads.py``), every candidate was timed, and every tuned
model deployed, on that half. This benchmark weighs the change on the README's job.

Protocol:

1. **Tune** the model as the README does (``gradtune tune MODEL --trials 128``, every other
   option the CLI's default) with ``TVM_NUM_THREADS`` set to 1 (TVM's default on a 2-core
   machine without SMT: the old behaviour) and to the machine's physical cores (gradtune's
   default now), ``--repeats`` times each, the order alternating, one run at a time, into
   ``WORK/runs/<model>/<threads>t-r<k>``.
2. **Time** every library in fresh processes, alternating, ``--timings`` times each: tuned on
   one thread and run on one (old), tuned on one and run on all cores (the deploy-side fix
   alone), tuned and run on all cores (new). Each process times the library interleaved with
   ONNX Runtime on all cores (``time_rounds``), so each row's ratio to ONNX Runtime is
   measured side by side; medians over repeats and timings.

Resumable: a finished tune (its ``summary.json``) is kept; a half one starts again.

    .venv/bin/python bench/tvm_threads.py [--models examples/small_cnn.py] [--repeats 3]
    nohup .venv/bin/python bench/tvm_threads.py > /tmp/tvm_threads.log 2>&1 &

The last line printed is one JSON object: ``{"models": {name: {"old_ms", "deploy_fix_ms",
"new_ms", "old_over_new", "old_vs_ort", "new_vs_ort"}}, "cores": n, "commit": c}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from searchbench.layout import add_work_and_out, resolve_out, write_json
from searchbench.models import ROOT
from searchbench.report import conditions, git_commit, machine

DEFAULT_WORK = ROOT / "bench" / "work" / "tvm_threads"
TRIALS = 128  # the README's job


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", type=Path,
                        default=[ROOT / "examples" / "small_cnn.py"])  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3, help="tunes per thread count (≥ 3)")
    parser.add_argument("--timings", type=int, default=3, help="timing processes per library")
    add_work_and_out(parser, DEFAULT_WORK)
    # Internal: the timing step, in a fresh process whose TVM_NUM_THREADS the parent set.
    parser.add_argument("--time", type=Path, metavar="RUN", help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--peer-threads", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    resolve_out(args, DEFAULT_WORK)
    return args


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments, in one line; None when nothing is."""
    missing = [str(m) for m in args.models if not m.is_file()]
    if missing:
        return f"no such model file: {', '.join(missing)}"
    if args.repeats < 3:
        return "--repeats must be at least 3"
    if args.timings < 1:
        return "--timings must be at least 1"
    return None


def tune(run: Path, model: Path, threads: int) -> dict[str, Any]:
    """``gradtune tune MODEL --trials 128`` with TVM's runtime on ``threads``."""
    summary = run / "summary.json"
    if summary.is_file():
        return json.loads(summary.read_text())
    if run.exists():
        shutil.rmtree(run)  # half a tune: from nothing
    run.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "gradtune.cli", "tune", str(model), "--trials", str(TRIALS),
            "--out", str(run), "--name", f"tvm-threads-{model.stem}".replace("_", "-")]  # fmt: skip
    print(f"{model.stem} {run.name}: tuning, TVM_NUM_THREADS={threads}", flush=True)
    log = run.parent / f"{run.name}.log"
    with open(log, "w") as out:
        env = {**os.environ, "TVM_NUM_THREADS": str(threads)}
        done = subprocess.run(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise RuntimeError(f"gradtune tune exited {done.returncode}; see {log}")
    return json.loads(summary.read_text())


def time_library(run: Path, model: Path, peer_threads: int) -> dict[str, float]:
    """Child: the run's library on this process's TVM threads against ONNX Runtime."""
    import tvm

    from gradtune import compilation, peers
    from gradtune.frontend import load_model
    from gradtune.target import make_target
    from gradtune.threads import runtime_threads

    summary = json.loads((run / "summary.json").read_text())
    imported = load_model(str(model))
    tuned = compilation.Runner(
        tvm.runtime.load_module(str(run / "model.so")), make_target(summary["target"]),
        imported.inputs,
    )  # fmt: skip
    compilation.verify(tuned.outputs(), imported.reference_outputs, "tuned TVM")
    with peers.torch_threads(peer_threads):
        found = peers.build_peers(imported, peer_threads)
        ort = found.runnable()[peers.ORT]
        ms = compilation.time_rounds(
            {"tuned": tuned.run, "ort": ort},
            repeats=7,
            pools={"tuned": "tvm", "ort": peers.POOLS[peers.ORT]},
        ).medians()
    return {"tuned_ms": ms["tuned"], "ort_ms": ms["ort"], "tvm_threads": runtime_threads()}


def time_in_child(run: Path, model: Path, threads: int, peer_threads: int) -> dict[str, float]:
    argv = [sys.executable, str(Path(__file__).resolve()), "--time", str(run), "--model",
            str(model), "--peer-threads", str(peer_threads)]  # fmt: skip
    env = {**os.environ, "TVM_NUM_THREADS": str(threads)}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"timing {run} failed: {done.stderr.strip()[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["tvm_threads"] == threads, result  # the count the row claims
    return result


ROWS = {  # row: (tuned on, run on): 0 stands for all cores
    "old": (1, 1),
    "deploy_fix": (1, 0),
    "new": (0, 0),
}


def bench_model(args: argparse.Namespace, model: Path, n: int) -> dict[str, Any]:
    base = args.work / "runs" / model.stem
    runs: dict[int, list[Path]] = {1: [], n: []}
    for k in range(args.repeats):
        order = (1, n) if k % 2 == 0 else (n, 1)
        for threads in order:
            run = base / f"{threads}t-r{k}"
            tune(run, model, threads)
            runs[threads].append(run)
    samples: dict[str, list[dict[str, float]]] = {row: [] for row in ROWS}
    for _ in range(args.timings):
        for row, (tuned_on, run_on) in ROWS.items():
            for run in runs[tuned_on or n]:
                samples[row].append(time_in_child(run, model, run_on or n, n))
    result: dict[str, Any] = {}
    for row, values in samples.items():
        result[f"{row}_ms"] = statistics.median(v["tuned_ms"] for v in values)
        result[f"{row}_vs_ort"] = statistics.median(v["tuned_ms"] / v["ort_ms"] for v in values)
    result["ort_ms"] = statistics.median(v["ort_ms"] for vs in samples.values() for v in vs)
    result["old_over_new"] = result["old_ms"] / result["new_ms"]
    result["trials"] = {str(t): [json.loads((r / "summary.json").read_text())["total_trials"]
                                 for r in rs] for t, rs in runs.items()}  # fmt: skip
    return result


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "# TVM's runtime on half the cores or on all of them (the README's job)",
        "",
        conditions(data["commit"], data["machine"]),
        f"{data['repeats']} tunes per thread count (`gradtune tune MODEL --trials {TRIALS}`,"
        f" alternating), each library timed in {data['timings']} fresh processes interleaved"
        f" with ONNX Runtime on {data['cores']} threads; medians. `bench/tvm_threads.py`.",
        "",
        "| model | tuned on / run on (threads) | ms | / ONNX Runtime |",
        "|---|---|---:|---:|",
    ]
    for name, r in data["models"].items():
        for row, (tuned_on, run_on) in ROWS.items():
            label = f"{tuned_on or data['cores']} / {run_on or data['cores']} ({row})"
            lines.append(f"| {name} | {label} | {r[row + '_ms']:.3f} | {r[row + '_vs_ort']:.2f} |")
        lines.append(f"| {name} | ONNX Runtime | {r['ort_ms']:.3f} | 1 |")
    lines.append("")
    for name, r in data["models"].items():
        lines.append(f"- {name}: old / new = **{r['old_over_new']:.2f}×**; trials {r['trials']}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.time is not None:
        print(json.dumps(time_library(args.time, args.model, args.peer_threads)))
        return 0
    problem = check(args)
    if problem:
        print(f"tvm_threads: {problem}", file=sys.stderr)
        return 2
    from gradtune.threads import host_cores

    n = host_cores()
    if n < 2:
        print("one core: nothing to compare", file=sys.stderr)
        return 2
    models = {model.stem: bench_model(args, model, n) for model in args.models}
    from gradtune.target import parse_target

    data = {
        "commit": git_commit(), "machine": machine(parse_target(None)), "cores": n,
        "repeats": args.repeats, "timings": args.timings, "models": models,
    }  # fmt: skip
    write_json(args.out / "tvm_threads.json", data)
    (args.out / "tvm_threads.md").write_text(markdown(data))
    print(markdown(data))
    keys = ("old_ms", "deploy_fix_ms", "new_ms", "old_over_new", "old_vs_ort", "new_vs_ort")
    line = {"models": {m: {k: r[k] for k in keys} for m, r in models.items()}, "cores": n,
            "commit": data["commit"]}  # fmt: skip
    print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
