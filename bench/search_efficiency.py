"""Felix's headline experiment on this CPU: gradient search vs MetaSchedule's evolutionary
search, each as ``gradtune tune --search S --time-budget B --trials 5000`` would run it.

Protocol (the parts live in bench/searchbench/):

1. **Models** (``searchbench.models``): the four examples (ResNet-18-like, MobileNetV2-like,
   Transformer encoder, DCGAN-like; zoo models) and four in no zoo (bench/models/: an
   MBConv/squeeze-excitation CNN, a small UNet, a BERT-style block and a SqueezeNet-style CNN,
   both tuned from ONNX).
2. **No leakage** (``searchbench.prepare``): per model, the gradient search's cost model is
   pretrained (params.yaml's ``pretrain`` settings) without every workload the dataset
   attributes to that model at any batch, and without any workload hashing like one of the
   model's own tasks; the overlap left is asserted 0 and reported. Evolutionary search gets
   MetaSchedule's defaults: XGBoost from nothing.
3. **Runs** (``searchbench.run``): every (model, searcher, repeat) in a fresh subprocess, from
   an empty database, seed = repeat, with the CLI's builder, local RPC fleet, task scheduler,
   threads and default batch. Order: all models' repeat 0 first, models round-robin, the
   searcher going first alternating (``searchbench.layout.plan``).
4. **Budget**: a timer sets the stop signal at B seconds; only the records measured by B
   count (each batch is stamped with its wall-clock time; the JSONDatabase's first N records
   are its state at that time). Actual wall time and overrun are reported, > 5% flagged.
5. **Metrics** (``searchbench.analysis``): time to 95% of the best-known estimated latency
   (median over repeats, ratio evo/grad, bounds marked and never averaged), and to 90% and
   99% (Felix's milestones); end-to-end latency at ¼, ½ and all of B (compiled from the
   truncated database, outputs verified, all of a model's libraries timed interleaved in one
   process, in passes, each ratio taken within a pass: ``searchbench.timing``); trials per
   minute.

    .venv/bin/python bench/search_efficiency.py [--budget 300] [--repeats 3] [--models ...]
    nohup .venv/bin/python bench/search_efficiency.py > /tmp/search_efficiency.log 2>&1 &
    .venv/bin/python bench/search_efficiency.py --render     # re-analyse the saved runs
    .venv/bin/python bench/search_efficiency.py --kernels bert_block  # where the kernels differ
    .venv/bin/python bench/search_efficiency.py --sweep      # batch 8 / default / 64, 2 models
                                                             # (--sweep --render: its report)

Interrupted (Ctrl-C, ``kill PID``), the same command resumes: finished runs are kept, a
half-finished one is restarted. State lives in ``--work`` (default bench/work/, git-ignored).
A benchmark longer than a session moves between machines through git:
``--archive bench/results/search_efficiency_runs`` keeps each finished run's result and the
records its libraries were built from (``searchbench.archive``), and ``--restore`` with the
same directory puts them back (libraries rebuilt and verified) before the same command
resumes.
Writes ``--out``/search_efficiency.{md,json} and search_efficiency_<model>.png (marked
PARTIAL until every run finished); the last line printed is the JSON summary
``{"models": {name: {"t95_ratio", "t95_ratio_range", "t95_bound", "e2e_ratio_at_budget",
"e2e_ratio_at_budget_passes", "milestone_ratios", "leaked_workloads", "repeats"}},
"geomean_t95_ratio", "geomean_e2e_ratio_at_budget", "partial", "commit", "failed_models"}``.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import traceback
from pathlib import Path

from searchbench import driver, report
from searchbench.layout import Layout, RunSpec, add_work_and_out, plan, resolve_out, write_json
from searchbench.models import MODELS, ROOT

SWEEP_MODELS = ("dcgan_like", "bert_block")
SWEEP_PER_ROUND: tuple[int | None, ...] = (8, None, 64)


DEFAULT_WORK = ROOT / "bench" / "work"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=300.0, help="seconds per run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per searcher and model")
    parser.add_argument("--models", nargs="+", default=None, choices=sorted(MODELS))
    add_work_and_out(parser, DEFAULT_WORK)
    parser.add_argument(
        "--gradient-config", default="", metavar="FIELD=VALUE,...",
        help="an ablation: the gradient search with these GradientConfig fields (its runs and "
        "results files are kept apart from the default configuration's; its evolutionary runs "
        "are the default configuration's, copied in where they are finished)",
    )  # fmt: skip
    parser.add_argument(
        "--measure", default="fixed", choices=["fixed", "adaptive", "handoff"],
        help="how candidates are timed (gradtune tune --measure), both searchers' runs; "
        "runs not fixed live apart",
    )  # fmt: skip
    parser.add_argument(
        "--warmup", default="model", metavar="model|stake|fresh|skip",
        help="the task scheduler's warm-up (gradtune tune --warmup), both searchers' runs; "
        "runs not model live apart",
    )  # fmt: skip
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--render", action="store_true", help="only re-analyse saved results")
    mode.add_argument(
        "--archive", type=Path, metavar="DIR",
        help="copy the finished runs (result, best record per workload) to DIR, for git",
    )  # fmt: skip
    mode.add_argument(
        "--kernels", metavar="MODEL", choices=sorted(MODELS),
        help="per task, every run's best kernel with its vector and parallel extents",
    )  # fmt: skip
    mode.add_argument(
        "--versus", metavar="MODEL",
        help="time the finished libraries of MODEL of this --gradient-config and of the default "
        "configuration interleaved in one process, and print the medians side by side",
    )  # fmt: skip
    parser.add_argument(
        "--against", action="append", default=[], metavar="FIELD=VALUE,...",
        help="with --versus: time this --gradient-config's libraries alongside too (repeatable), "
        "to weigh an ablation against another one rather than only against the default",
    )  # fmt: skip
    mode.add_argument(
        "--restore", type=Path, metavar="DIR",
        help="put archived runs back into --work (libraries rebuilt), then stop",
    )  # fmt: skip
    parser.add_argument(
        "--sweep", action="store_true",
        help=f"batch sizes {{8, default, 64}} on {' and '.join(SWEEP_MODELS)} (--models to change)",
    )  # fmt: skip
    # Internal: the steps the orchestrator runs in subprocesses.
    mode.add_argument("--one", nargs=3, metavar=("MODEL", "SEARCHER", "REPEAT"),
                      help=argparse.SUPPRESS)  # fmt: skip
    mode.add_argument("--prepare", metavar="MODEL", help=argparse.SUPPRESS)
    mode.add_argument("--time", metavar="MODEL", help=argparse.SUPPRESS)
    parser.add_argument("--per-round", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # One work directory holds the runs of several budgets: a render of one budget must not
    # overwrite another's.
    resolve_out(args, DEFAULT_WORK, runs=Layout(args.work, args.budget).root)
    return args


def specs_of(args: argparse.Namespace) -> tuple[list[RunSpec], str]:
    """The planned runs and the name of their results files."""
    if args.sweep:
        models = args.models or list(SWEEP_MODELS)
        return plan(models, args.repeats, SWEEP_PER_ROUND), "search_efficiency_sweep"
    return plan(args.models or list(MODELS), args.repeats), "search_efficiency"


def render(layout: Layout, specs: list[RunSpec], out: Path, stem: str) -> dict:
    models = list(dict.fromkeys(s.model for s in specs))
    data = report.gather(layout, specs, models)
    text = report.write(data, layout, specs, out, stem)
    return {"text": text, "summary": report.summary_line(data)}


def one(args: argparse.Namespace, layout: Layout) -> int:
    """Child: one tuning run; its result (or its error) goes to result.json."""
    from searchbench import run

    model, searcher, repeat = args.one
    spec = RunSpec(model, searcher, int(repeat), args.per_round)
    return driver.child(layout, spec, lambda: run.run(spec, layout))


def prepare_child(args: argparse.Namespace, layout: Layout) -> int:
    from searchbench.prepare import prepare

    try:
        prepare(MODELS[args.prepare], layout)
    except Exception:
        error = traceback.format_exc()
        print(error, file=sys.stderr)
        record = {"model": args.prepare, "source_sha1": MODELS[args.prepare].source_sha1()}
        write_json(layout.prepared(args.prepare), record | {"error": error})
    return 0


def versus(args: argparse.Namespace, layout: Layout) -> int:
    """The ablation's final libraries against the default configuration's (and each
    ``--against`` one's), interleaved in one process."""
    from searchbench.report import git_commit
    from searchbench.timing import final_libraries, time_versus

    if not args.gradient_config and args.measure == "fixed" and args.warmup == "model":
        print("search_efficiency: --versus compares a --gradient-config (or a --measure, a "
              "--warmup) with the default configuration", file=sys.stderr)  # fmt: skip
        return 2
    name = layout.root.name.split("s-", 1)[1]
    layouts = {"default": Layout(layout.work, layout.budget), name: layout}
    for config in args.against:
        layouts[config] = Layout(layout.work, layout.budget, config, layout.measure, layout.warmup)
    for each in layouts.values():
        if not final_libraries({"": each}, args.versus):
            # A layout is named by its budget too: the usual slip is a --budget left out.
            dirs = [d.parent.name for d in layout.work.glob("*/runs")]
            found = (re.match(r"\d+(?:\.\d+)?(?=s)", d) for d in dirs)
            budgets = sorted({m.group() for m in found if m}, key=float)
            print(f"search_efficiency: no finished runs of {args.versus} in {each.root} "
                  f"(--budget {layout.budget:g}; layouts here have budgets "
                  f"{', '.join(budgets) or 'none'})", file=sys.stderr)  # fmt: skip
            return 2
    against = "".join(f"+{config}" for config in args.against)
    out = layout.root / "timing" / f"{args.versus}-versus-default{against}.json"
    record = time_versus(layouts, args.versus, out)
    over = record.get("default_gradient_over", {})
    print(f"{args.versus}: median end-to-end ms at the budget, timed interleaved in "
          f"{len(record['passes'])} passes (commit {git_commit()}, load "
          f"{record['loadavg_before'][0]} → {record['loadavg_after'][0]}); default gradient / "
          "this: median of the ratios within each pass")  # fmt: skip
    for group, value in record["median_ms"].items():
        ratio = f"  default gradient / this = {over[group]:.3f}" if group in over else ""
        print(f"  {group:<60} {value:8.4f}{ratio}")
    print(json.dumps({"model": args.versus, "median_ms": record["median_ms"]}))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.against and not args.versus:
        print("search_efficiency: --against weighs a configuration in a --versus timing; "
              "give --versus MODEL", file=sys.stderr)  # fmt: skip
        return 2
    from gradtune.search import WARMUPS

    if args.warmup not in WARMUPS:
        print(f"search_efficiency: unknown --warmup {args.warmup!r}; choose one of "
              f"{', '.join(WARMUPS)}", file=sys.stderr)  # fmt: skip
        return 2
    layout = Layout(
        args.work.resolve(), args.budget, args.gradient_config, args.measure, args.warmup
    )
    if problem := layout.config_problem():
        print(f"search_efficiency: {problem}", file=sys.stderr)
        return 2
    # A child asked to stop by SIGTERM stops as on Ctrl-C: between batches, fleet shut down.
    signal.signal(signal.SIGTERM, lambda *_: signal.raise_signal(signal.SIGINT))
    if args.one:
        return one(args, layout)
    if args.prepare:
        return prepare_child(args, layout)
    if args.archive or args.restore:
        from searchbench import archive

        if args.archive:
            archive.archive(layout, args.archive)
        else:
            archive.restore(layout, args.restore)
        return 0
    if args.kernels:
        from searchbench.kernels import table

        print(table(layout, args.kernels))
        return 0
    if args.versus:
        return versus(args, layout)
    if args.time:
        from searchbench.timing import time_model

        time_model(layout, args.time)
        return 0
    specs, stem = specs_of(args)
    if args.gradient_config:
        stem += "_" + args.gradient_config.replace("=", "").replace(",", "_")
    if args.measure != "fixed":
        stem += f"_{args.measure}"
    if args.warmup != "model":
        stem += f"_warmup_{args.warmup}"
    if not args.render:
        if mixed := layout.mixed_config(specs, ("gradient",)):
            print(f"search_efficiency: {mixed}; name it with --gradient-config, or use another "
                  "--work", file=sys.stderr)  # fmt: skip
            return 2
        if redundant := layout.redundant_config(specs):
            print(f"search_efficiency: {redundant}", file=sys.stderr)
            return 2
        completed = driver.run_all(layout, specs, lambda: render(layout, specs, args.out, stem))
    rendered = render(layout, specs, args.out, stem)
    print(rendered["text"])
    print(json.dumps(rendered["summary"]))
    return 0 if args.render or completed else 130


if __name__ == "__main__":
    sys.exit(main())
