"""Is a tuned model worth deploying? gradtune against ONNX Runtime, torch.compile and eager.

Protocol:

1. **Models** (``searchbench.models``, as bench/search_efficiency.py uses them): the four
   examples (ResNet-18-like, MobileNetV2-like, Transformer encoder, DCGAN-like: zoo models,
   whose workloads the default cost model was pretrained on) and four in no zoo (bench/models/:
   an MBConv/squeeze-excitation CNN, a small UNet, a BERT-style block and a SqueezeNet-style
   CNN, the last two tuned from ONNX).
2. **Tune**: ``gradtune tune FILE --time-budget B --trials 5000`` in a subprocess (B:
   ``--budget``, or a model's own ``--budget-for``; each result states its), every other
   option the CLI's default (gradient search with the shipped pretrained cost model, local RPC
   fleet, this CPU with its core count), into ``WORK/runs/<model>``.
3. **Time**: a fresh process loads the exported ``model.so``, checks its outputs against the
   reference, builds the peers (``gradtune.peers``: ONNX Runtime, torch.compile, PyTorch eager,
   all on the target's ``num-cores`` threads) and times them with the tuned model interleaved
   in that one process (``time_rounds``: alternating calls, the median of ``--repeats``
   repeats, at least 7, over the rounds the cross-core probe found in one state; timed again
   while the cores sat apart, ``TIMING_ATTEMPTS`` times at most). The ONNX model's PyTorch
   peers run its source's ``get_model()``, the seeded network its ONNX file was exported from.
4. **Ratio** = tuned ms / peer ms: below 1 the tuned model is faster. The geomean is over the
   models ONNX Runtime ran.

Resumable: each model's result is ``WORK/results/<model>.json`` and a model whose result
matches the budget and the model's source is skipped (delete the file to redo it), but timed
again (not tuned) if its timing ran with the cores apart in fewer than ``TIMING_ATTEMPTS``
attempts or predates the cross-core probe; a tune that did not finish is started again from
nothing, so the budget holds. So is a model tuned
with gradient-search defaults that have moved since (its ``gradient_config``, every field the
tune's summary.json recorded).

    .venv/bin/python bench/vs_runtimes.py [--budget 480] [--models ...] [--work DIR]
    .venv/bin/python bench/vs_runtimes.py --render     # gather the finished models only
    .venv/bin/python bench/vs_runtimes.py --retime     # time the tuned libraries again
    .venv/bin/python bench/vs_runtimes.py --budget-for unet_small=1200   # its own budget
    nohup .venv/bin/python bench/vs_runtimes.py > /tmp/vs_runtimes.log 2>&1 &

Writes ``--out``/vs_runtimes.{md,json} (commit, machine, load averages; marked PARTIAL until
every model finished). The last line printed is one JSON object: ``{"models": {name:
{"vs_ort", "vs_torch_compile", "budget_s"}}, "geomean_vs_ort"}``.

A compilation option is weighed end to end by tuning with it in a work directory of its own
and timing its library beside the default's, in the same rounds as the peers (a ratio of
vs-ORT ratios from two timings would carry two timings' drift):

    .venv/bin/python bench/vs_runtimes.py --models resnet18_like --work bench/work/vsr-nchwc \
        --tune-args="--conv-layout NCHWc" --alongside bench/work/vs_runtimes
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from searchbench.analysis import geomean
from searchbench.layout import (
    add_work_and_out,
    config_moved,
    resolve_out,
    today_defaults,
    write_json,
)
from searchbench.models import MODELS, ROOT, BenchModel
from searchbench.report import conditions, git_commit, machine

from gradtune.crosscore import APART, NEAR, fastest, round_states

TRIALS = 5000  # as search_efficiency: the budget ends the run; the trials only size batches
MIN_REPEATS = 7
# Timings of one model at most, until one runs with the cores near: ~25 s each, and a VM's
# host kept its two vCPUs apart for minutes at a time (gradtune.crosscore).
TIMING_ATTEMPTS = 4
ALONGSIDE = "tuned (alongside)"  # --alongside's library, a contender of the timing


DEFAULT_WORK = ROOT / "bench" / "work" / "vs_runtimes"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=480.0, help="tuning seconds per model")
    parser.add_argument(
        "--budget-for", action="append", default=[], metavar="MODEL=SECONDS",
        help="tuning seconds for one model instead of --budget (repeatable): the budget a "
        "model needs is stated per model in the results",
    )  # fmt: skip
    parser.add_argument("--trials", type=int, default=TRIALS, help="gradtune tune --trials")
    parser.add_argument("--repeats", type=int, default=11, help=f"timing repeats (≥ {MIN_REPEATS})")
    parser.add_argument("--models", nargs="+", default=None, choices=sorted(MODELS))
    add_work_and_out(parser, DEFAULT_WORK)
    parser.add_argument(
        "--tune-args", default="", metavar="ARGS",
        help="more gradtune tune options, one string (a compilation option such as "
        "'--conv-layout NCHWc'); recorded with each result, and a result tuned with other ones "
        "is tuned again",
    )  # fmt: skip
    parser.add_argument(
        "--alongside", type=Path, default=None, metavar="WORK",
        help="another work directory of this benchmark: its finished library of each model is "
        "timed in the same rounds as this one's and the peers ('vs_alongside' = this tuned ms "
        "/ that one's)",
    )  # fmt: skip
    parser.add_argument(
        "--retime", action="store_true",
        help="time every tuned model's library again, in this run's cores state (with "
        "--alongside's); tune nothing",
    )  # fmt: skip
    parser.add_argument("--render", action="store_true",
                        help="only gather the finished models' results; tune nothing")  # fmt: skip
    # Internal: the timing step, run in a fresh process.
    parser.add_argument("--time", metavar="MODEL", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    resolve_out(args, DEFAULT_WORK)
    if args.repeats < MIN_REPEATS:
        parser.error(f"--repeats must be at least {MIN_REPEATS}")
    args.budgets = {}
    for item in args.budget_for:
        name, _, seconds = item.partition("=")
        if name not in MODELS:
            parser.error(f"--budget-for {item}: no benchmark model {name!r}")
        try:
            args.budgets[name] = float(seconds)
        except ValueError:
            parser.error(f"--budget-for {item}: {seconds!r} is not a number of seconds")
        if not args.budgets[name] > 0:
            parser.error(f"--budget-for {item}: the budget must be above 0 s")
    try:
        args.tune_args = shlex.split(args.tune_args)
    except ValueError as err:
        parser.error(f"--tune-args: {err}")
    if args.alongside is not None:
        args.alongside = args.alongside.resolve()
        if not args.alongside.is_dir():
            parser.error(f"--alongside: {args.alongside} is not a directory")
    return args


def budget_of(args: argparse.Namespace, model: str) -> float:
    """The tuning seconds of ``model``: its ``--budget-for``, else ``--budget``."""
    return args.budgets.get(model, args.budget)


def result_path(work: Path, model: str) -> Path:
    return work / "results" / f"{model}.json"


def run_dir(work: Path, model: str) -> Path:
    return work / "runs" / model


def tuned(
    work: Path, bench: BenchModel, budget: float, trials: int, tune_args: list[str] | None = None
) -> dict[str, Any] | None:
    """The model's result, if it was tuned as asked (however its timing went)."""
    path = result_path(work, bench.name)
    if not path.is_file():
        return None
    result = json.loads(path.read_text())
    as_asked = (
        result.get("budget_s") == budget
        and result.get("trials_budget") == trials
        and result.get("tune_args", []) == (tune_args or [])
        and result.get("source_sha1") == bench.source_sha1()
        # Tuned with the CLI's defaults of then: a default that moved since is tuned again.
        and config_moved(result.get("gradient_config"), today_defaults()) is None
    )
    return result if as_asked else None


def finished(
    work: Path, bench: BenchModel, budget: float, trials: int, tune_args: list[str] | None = None
) -> bool:
    result = tuned(work, bench, budget, trials, tune_args)
    # Timed with the cores near, or as often as it takes to give up: else timed again (the
    # tune stands).
    return result is not None and (
        (result.get("timing") or {}).get("state") == "near"
        or result.get("timing_attempts", 0) >= TIMING_ATTEMPTS
    )


# --------------------------------------------------------------------------- tune


def tune(
    work: Path, bench: BenchModel, budget: float, trials: int, tune_args: list[str]
) -> dict[str, Any]:
    """``gradtune tune`` with the CLI's defaults (but ``tune_args``) at ``budget``; returns its
    summary.json."""
    out = run_dir(work, bench.name)
    summary = out / "summary.json"
    stamp = out / "bench.json"  # what this directory was tuned with
    wanted = {"budget_s": budget, "trials": trials, "source_sha1": bench.source_sha1(),
              "gradient_config": today_defaults()}  # fmt: skip
    if tune_args:  # absent otherwise, so the stamps of earlier default runs still match
        wanted["tune_args"] = tune_args
    if summary.is_file() and stamp.is_file() and json.loads(stamp.read_text()) == wanted:
        return json.loads(summary.read_text())
    if out.exists():
        shutil.rmtree(out)  # half a tune, or another budget: from nothing, so the budget holds
    out.mkdir(parents=True)
    write_json(stamp, wanted)
    argv = [sys.executable, "-m", "gradtune.cli", "tune", str(bench.tuning_file(work)),
            "--time-budget", str(budget), "--trials", str(trials), "--out", str(out / "tune"),
            "--name", f"vs-runtimes-{bench.name}".replace("_", "-"), *tune_args]  # fmt: skip
    print(f"{bench.name}: tuning for {budget:.0f} s", flush=True)
    with open(out / "tune.log", "w") as log:
        proc = subprocess.run(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"gradtune tune exited {proc.returncode}; see {out / 'tune.log'}")
    shutil.copy(out / "tune" / "summary.json", summary)
    return json.loads(summary.read_text())


# --------------------------------------------------------------------------- time


def source_module(bench: BenchModel) -> Any:
    """The PyTorch network of a benchmark model's source (``get_model()``, seeded)."""
    spec = importlib.util.spec_from_file_location(f"vs_runtimes_{bench.name}", bench.source)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.get_model()[0]


def time_model(
    work: Path, name: str, repeats: int, alongside: Path | None = None
) -> dict[str, Any]:
    """Child: the tuned library against the peers (and ``alongside``'s library of the model,
    where it has one), interleaved in this process."""
    from gradtune import compilation, crosscore, peers
    from gradtune.frontend import load_model
    from gradtune.pipeline import peer_threads
    from gradtune.target import make_target

    bench = MODELS[name]
    out = run_dir(work, name)
    summary = json.loads((out / "summary.json").read_text())
    target = make_target(summary["target"])
    model = load_model(bench.tuning_file(work))
    import tvm

    tuned = compilation.Runner(
        tvm.runtime.load_module(str(out / "tune" / "model.so")), target, model.inputs
    )
    err = compilation.verify(tuned.outputs(), model.reference_outputs, "tuned TVM")
    contenders = {"tuned": tuned.run}
    other_lib = run_dir(alongside, name) / "tune" / "model.so" if alongside else None
    if other_lib is not None and other_lib.is_file():
        other = compilation.Runner(tvm.runtime.load_module(str(other_lib)), target, model.inputs)
        compilation.verify(other.outputs(), model.reference_outputs, "alongside's tuned TVM")
        contenders[ALONGSIDE] = other.run
    threads = peer_threads(summary["target"])
    twin = source_module(bench) if model.framework == "onnx" else None
    load_before = os.getloadavg()
    start = time.perf_counter()
    with peers.torch_threads(threads):
        found = peers.build_peers(model, threads, twin)
        attempts: list[Any] = []
        # Again, up to TIMING_ATTEMPTS times, while the cores sat apart (gradtune.crosscore).
        while len(attempts) < TIMING_ATTEMPTS:
            attempts.append(compilation.time_rounds(
                {**contenders, **found.runnable()}, repeats,
                pools={c: "tvm" for c in contenders} | peers.POOLS,
            ))  # fmt: skip
            reference = compilation.shared_reference(attempts)
            if attempts[-1].state(reference) == crosscore.NEAR:
                break
    # The last attempt: near if any was (the loop stops there; a later, faster probe only makes
    # an earlier attempt less near), else the last of TIMING_ATTEMPTS apart.
    timing = attempts[-1]
    ms = timing.medians(reference)
    errors = found.errors()
    peer = {p: {"ms": ms.get(p), "error": errors.get(p)} for p in peers.PEER_NAMES}

    def ratio(p: str) -> float | None:
        return ms["tuned"] / ms[p] if p in ms else None

    return {
        "model": name,
        "tuned_ms": ms["tuned"],
        "timing": timing.conditions(reference),
        "timing_attempts": len(attempts),
        "peers": peer,
        "vs_ort": ratio(peers.ORT),
        "vs_torch_compile": ratio(peers.TORCH_COMPILE),
        "vs_eager": ratio(peers.EAGER),
        "alongside": str(alongside) if ALONGSIDE in contenders else None,
        "alongside_ms": ms.get(ALONGSIDE),
        "vs_alongside": ratio(ALONGSIDE),
        "max_abs_err": err,
        "threads": threads,
        "repeats": repeats,
        "timing_seconds": round(time.perf_counter() - start, 1),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def time_in_child(
    work: Path, name: str, repeats: int, alongside: Path | None = None
) -> dict[str, Any]:
    """Run the timing step in a fresh process (no tuning leftovers: threads, caches, fleet)."""
    path = run_dir(work, name) / "timing.json"
    path.unlink(missing_ok=True)
    argv = [sys.executable, str(Path(__file__).resolve()), "--time", name, "--work", str(work),
            "--repeats", str(repeats)]  # fmt: skip
    if alongside is not None:
        argv += ["--alongside", str(alongside)]
    print(f"{name}: timing against the peers", flush=True)
    with open(run_dir(work, name) / "timing.log", "w") as log:
        subprocess.run(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=False)
    if not path.is_file():
        raise RuntimeError(f"timing failed; see {run_dir(work, name) / 'timing.log'}")
    return json.loads(path.read_text())


def tuned_at(summary: dict[str, Any]) -> str:
    """The gradtune commit that tuned a run: its summary's, or for a run recorded before
    summaries named it, the MLflow run's source commit (MLflow cannot tell a dirty checkout)."""
    commit = summary.get("gradtune_commit")
    if commit is None:
        from mlflow.tracking import MlflowClient

        run = MlflowClient(tracking_uri=summary["mlflow_uri"]).get_run(summary["run_id"])
        commit = run.data.tags.get("mlflow.source.git.commit", "unknown")
    return commit[:7] + (" dirty" if commit.endswith("-dirty") else "")


def bench_model(args: argparse.Namespace, bench: BenchModel) -> dict[str, Any]:
    work = args.work
    load_before = os.getloadavg()
    budget = budget_of(args, bench.name)
    summary = tune(work, bench, budget, args.trials, args.tune_args)
    timing = time_in_child(work, bench.name, args.repeats, args.alongside)
    result = {
        "model": bench.name,
        "zoo_model": bench.zoo_name,
        "source_sha1": bench.source_sha1(),
        "framework": summary["framework"],
        "budget_s": budget,
        "trials_budget": args.trials,
        "tune_args": args.tune_args,
        "search": summary["search"],
        "gradient_config": summary.get("gradient_config"),  # every field, defaults included
        "tuned_at": tuned_at(summary),
        "trials": summary["total_trials"],
        "tuning_seconds": summary["tuning_seconds"],
        "tasks": summary["tasks"],
        "default_schedule_tasks": len(summary.get("default_schedule_tasks", [])),
        "target": summary["target"],
        "loadavg_before_tuning": [round(x, 2) for x in load_before],
        # ONNX Runtime's profile against the tuned kernels per operator group, from the tune.
        "groups": summary.get("roofline", {}).get("groups", []),
        **timing,
    }
    write_json(result_path(work, bench.name), result)
    return result


def retime(args: argparse.Namespace, bench: BenchModel) -> None:
    """Time a tuned model's library again and keep the new timing in its result: results
    timed in one sitting share a cores state, and an earlier timing may not have."""
    result = tuned(args.work, bench, budget_of(args, bench.name), args.trials, args.tune_args)
    if result is None:
        print(f"{bench.name}: not tuned as asked in {args.work}: nothing to time", flush=True)
        return
    result.update(time_in_child(args.work, bench.name, args.repeats, args.alongside))
    write_json(result_path(args.work, bench.name), result)
    state = result["timing"]["state"]
    print(f"{bench.name}: timed again ({state}), vs ORT {fmt(result['vs_ort'])}", flush=True)


# --------------------------------------------------------------------------- results


def fmt(value: float | None, spec: str = ".2f") -> str:
    return "–" if value is None else format(value, spec)


def state_of(result: dict[str, Any]) -> str:
    return (result.get("timing") or {}).get("state", "unprobed")


def label_against_all(results: dict[str, dict[str, Any]]) -> None:
    """Label ``apart`` a result whose probes all read beyond ``crosscore.TOLERANCE`` of the
    fastest probe of all the results. Before the machine's fastest probe was kept between
    processes (gradtune.crosscore), a timing judged by its own fastest called itself near while
    the cores sat apart all along (on a 2-vCPU Zen 2 KVM guest: ~0.47 µs near, 1.3-1.9 µs
    apart)."""
    timings = [r["timing"] for r in results.values() if (r.get("timing") or {}).get("link_ns")]
    near = fastest([[t["link_ns"][0] for t in timings], [t.get("near_ns") for t in timings]])
    for r in results.values():
        t = r.get("timing") or {}
        # Its fastest and slowest probe, as one round: APART when both read apart.
        if (
            near
            and t.get("link_ns")
            and t["state"] == NEAR
            and round_states(t["link_ns"], near) == [APART]
        ):
            r["timing"] = {**t, "state": APART, "near_ns": round(near)}


def alongside_vs_ort(result: dict[str, Any]) -> float:
    """The ratio to ONNX Runtime of the library timed alongside, else of the model's own."""
    if result.get("alongside_ms") is None:
        return result["vs_ort"]
    return result["alongside_ms"] / result["peers"]["ONNX Runtime"]["ms"]


def gather(args: argparse.Namespace, names: list[str], failed: dict[str, str]) -> dict[str, Any]:
    results = {}
    for name in names:
        if finished(args.work, MODELS[name], budget_of(args, name), args.trials, args.tune_args):
            result = json.loads(result_path(args.work, name).read_text())
            if "tuned_at" not in result:  # recorded before results named their tune's commit
                summary = json.loads((run_dir(args.work, name) / "summary.json").read_text())
                result["tuned_at"] = tuned_at(summary)
            results[name] = result
    label_against_all(results)
    beside_ort = [r for r in results.values() if r["vs_ort"] is not None]  # ONNX Runtime ran
    # Each ratio holds within its timing's state, and the state moves each contender by its
    # own factor (on Zen 2, a tuned CNN 1.03 of ONNX Runtime near, 1.11-1.13 apart).
    by_state: dict[str, list[float]] = {}
    for r in beside_ort:
        by_state.setdefault(state_of(r), []).append(r["vs_ort"])
    return {
        "commit": git_commit(),
        "machine": machine(next((r["target"] for r in results.values()), None)),
        "budget_s": args.budget,
        "budget_for": args.budgets,
        "trials_budget": args.trials,
        "tune_args": args.tune_args,
        "partial": len(results) < len(names),
        "failed": failed,
        "models": results,
        "geomean_vs_ort": geomean([r["vs_ort"] for r in beside_ort]),
        # A library timed alongside is another tune of the model (a repeat, or another
        # option): the geomean with it in this one's place, from the same rounds' ONNX Runtime.
        "geomean_vs_ort_alongside": geomean([alongside_vs_ort(r) for r in beside_ort])
        if any(r.get("alongside_ms") for r in results.values())
        else None,
        "geomean_vs_ort_by_state": {
            s: {"geomean": geomean(v), "models": len(v)} for s, v in by_state.items()
        },
        "geomean_vs_torch_compile": geomean(
            [r["vs_torch_compile"] for r in results.values() if r["vs_torch_compile"] is not None]
        ),
    }


def cores_cell(result: dict[str, Any]) -> str:
    """The state and the fastest probe of the kept rounds' timing (ns)."""
    link_ns = (result.get("timing") or {}).get("link_ns")
    return state_of(result) + (f" ({link_ns[0]} ns)" if link_ns else "")


def state_geomeans(by_state: dict[str, dict[str, Any]]) -> str:
    """Each state's geomean vs ONNX Runtime, when the models were timed in more than one."""
    if len(by_state) < 2:
        return ""
    parts = [f"{s} {fmt(g['geomean'])} ({g['models']} models)" for s, g in by_state.items()]
    return " Within one cores state, vs ONNX Runtime: " + ", ".join(parts) + "."


def markdown(data: dict[str, Any]) -> str:
    m = data["machine"]
    lines = [
        "# gradtune against what you would deploy instead"
        + (" (PARTIAL)" if data["partial"] else ""),
        "",
        conditions(data["commit"], m) + " Each model tuned by `gradtune tune --time-budget "
        f"{data['budget_s']:.0f} --trials {data['trials_budget']}"
        + "".join(f" {shlex.quote(a)}" for a in data.get("tune_args", []))
        + "` (every other option the CLI's default"
        + (
            "; `--time-budget` as its row's budget column states, `--budget-for`"
            if any(r["budget_s"] != data["budget_s"] for r in data["models"].values())
            else ""
        )
        + "), then its compiled library timed against the "
        "peers interleaved in one fresh process, all on the target's core count (median of the "
        "repeats). Ratio = tuned ms / peer ms: below 1 the tuned model is faster. The machine "
        "may be shared: see the load averages (1, 5, 15 min) recorded per model. The commit "
        "above rendered this file; each model was tuned at the commit its row names. 'cores': "
        "how near the two cores sat while the kept rounds ran (`gradtune.crosscore`: an empty "
        "parallel launch of TVM's pool bracketing every round, its fastest reading in "
        "brackets): 'near' the machine's fastest, 'apart' as when a VM's host moves its vCPUs "
        "apart (every contender slower, each by its own factor; timed "
        f"again up to {TIMING_ATTEMPTS} times until near), 'unprobed' before the probe.",
        "",
        "| model | zoo | budget s | tuned at | trials | tuned ms | ONNX Runtime ms "
        "| torch.compile ms | eager ms | vs ORT | vs torch.compile | vs eager | cores "
        "| load avg (timing) |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    notes = []
    for name, r in data["models"].items():
        p = r["peers"]
        cells = [
            name, r["zoo_model"] or "held out", f"{r['budget_s']:.0f}", r["tuned_at"],
            str(r["trials"]),
            f"{r['tuned_ms']:.3f}",
            fmt(p["ONNX Runtime"]["ms"], ".3f"), fmt(p["torch.compile"]["ms"], ".3f"),
            fmt(p["PyTorch eager"]["ms"], ".3f"), fmt(r["vs_ort"]), fmt(r["vs_torch_compile"]),
            fmt(r["vs_eager"]), cores_cell(r),
            " / ".join(f"{x:.1f}" for x in r["loadavg_before"]),
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
        notes += [f"- {name}, {peer}: {v['error']}" for peer, v in p.items() if v["error"]]
    lines += [
        "",
        f"Geomean vs ONNX Runtime: {fmt(data['geomean_vs_ort'])}; vs torch.compile: "
        f"{fmt(data['geomean_vs_torch_compile'])}."
        + state_geomeans(data.get("geomean_vs_ort_by_state") or {}),
        "",
    ]
    beside = [(n, r) for n, r in data["models"].items() if r.get("vs_alongside") is not None]
    if beside:
        lines += [
            "Timed in the same rounds, the library of another work directory of this benchmark "
            "(`--alongside`); ratio = this tuned ms / that one's:",
            "",
            *[f"- {n}: {r['tuned_ms']:.3f} against {r['alongside_ms']:.3f} ms "
              f"({r['alongside']}): {r['vs_alongside']:.2f}" for n, r in beside],
            "",
            "With those libraries in these ones' place, the geomean vs ONNX Runtime is "
            f"{fmt(data.get('geomean_vs_ort_alongside'))}.",
            "",
        ]  # fmt: skip
    if notes:
        lines += ["Peers that did not run:", "", *notes, ""]
    if data["failed"]:
        lines += ["Failed:", "", *[f"- {k}: {v}" for k, v in data["failed"].items()], ""]
    lines += [
        "## Where the time goes, per operator group",
        "",
        "From each tune's report: the tuned kernels (Σ calls × µs) against ONNX Runtime's "
        "profiler, totalled per operator group (their fusions differ, so no node maps to one "
        "task).",
        "",
        "| model | group | TVM tasks | tuned µs | ONNX Runtime µs |",
        "|---|---|---:|---:|---:|",
    ]
    for name, r in data["models"].items():
        for g in r["groups"]:
            cells = [
                name,
                g["group"],
                str(g["tasks"]),
                f"{g['tuned_us']:.1f}",
                fmt(g["ort_us"], ".1f"),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def summary_line(data: dict[str, Any]) -> dict[str, Any]:
    return {
        "models": {
            name: {
                "vs_ort": r["vs_ort"],
                "vs_torch_compile": r["vs_torch_compile"],
                "budget_s": r["budget_s"],
            }
            for name, r in data["models"].items()
        },
        "geomean_vs_ort": data["geomean_vs_ort"],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.work = args.work.resolve()
    if args.time:
        record = time_model(args.work, args.time, args.repeats, args.alongside)
        write_json(run_dir(args.work, args.time) / "timing.json", record)
        return 0
    names = args.models or list(MODELS)
    failed: dict[str, str] = {}
    for name in [] if args.render else names:
        bench = MODELS[name]
        if args.retime:
            retime(args, bench)
            continue
        if finished(args.work, bench, budget_of(args, name), args.trials, args.tune_args):
            print(f"{name}: done before, kept", flush=True)
            continue
        try:
            result = bench_model(args, bench)
        except KeyboardInterrupt:
            print("interrupted: run the same command to resume", file=sys.stderr)
            return 130
        except Exception as err:
            traceback.print_exc()
            failed[name] = f"{type(err).__name__}: {err}"
            continue
        print(f"{name}: tuned {result['tuned_ms']:.3f} ms, vs ORT {fmt(result['vs_ort'])}, "
              f"vs torch.compile {fmt(result['vs_torch_compile'])}", flush=True)  # fmt: skip
    data = gather(args, names, failed)
    text = markdown(data)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "vs_runtimes.json", data)
    (args.out / "vs_runtimes.md").write_text(text)
    print(text)
    print(json.dumps(summary_line(data)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
