"""AdaTune's levers on gradtune's gradient search, added one at a time (issue 15).

Protocol (the parts live in bench/adatunebench/; models, preparation, the run machinery and
the interleaved timing are the search-efficiency benchmark's, bench/searchbench/):

1. **Models** (``searchbench.models``): by default two zoo models (dcgan_like, resnet18_like)
   and two in no zoo (mbconv_se, bert_block). Each is prepared once: its cost model and a
   four-member ensemble pretrained without any of the model's workloads (overlap asserted 0).
2. **Configurations** (``adatunebench.layout.CONFIGS``), incremental as in AdaTune's
   Fig. 10–11: ``baseline`` (today's search, fixed measurement), ``ensemble_ei`` (+ the deep
   ensemble and log EI), ``contextual`` (+ Eq. 3's explore share), ``full`` (+ the adaptive
   evaluator); and ``adaptive_only`` (the adaptive evaluator alone). Then MetaSchedule's
   evolutionary search as it ships (``evolutionary``: the peer) and scoring with the
   ensemble as a ``PyCostModel`` instead of its XGBoost (``evolutionary_ensemble``).
3. **Runs**: each configuration tunes each model from an empty database, in a fresh process,
   with the CLI's settings (``gradtune tune --time-budget B``: builder, local RPC fleet of one
   server, gradient task scheduler, default batch), seed = repeat; a timer stops it at B.
   Order: repeat-major, models round-robin, configurations rotated per model and repeat.
4. **Timing**: every configuration's library of a model (the model as tuned by B, outputs
   verified) timed interleaved in one process.
5. **Metrics** (``adatunebench.analysis``): device measurement seconds per trial, trials per
   minute, t95 (to 95% of the best any configuration reached), the time to reach the
   baseline's final latency, the end-to-end latency at B. The adaptive evaluator's accuracy
   against long fixed measurements of ≥ 50 candidates is ``bench/adaptive_evaluator.py``'s
   (its result and commit are quoted).

    .venv/bin/python bench/adatune_ablation.py [--budget 300] [--repeats 3] [--models ...]
    nohup .venv/bin/python bench/adatune_ablation.py > /tmp/adatune.log 2>&1 &
    .venv/bin/python bench/adatune_ablation.py --render      # re-analyse the saved runs

Interrupted (Ctrl-C, ``kill PID``), the same command resumes: finished runs are kept, a
half-finished one is restarted. Writes ``--out``/adatune_ablation.{md,json} and a plot per
model (marked PARTIAL until every run finished); the last line printed is one JSON object:
``{"configs": {name: {...}}, "measure_seconds_ratio", "adaptive_latency_error_median",
"t95_ratio_full_over_baseline", "final_latency_ratio", ...}``.

The work dir does not outlive a session's machine, and the whole ablation (~5.5 h at 300 s)
outlasts a session. ``--archive DIR`` keeps each finished run's result and best record per
workload (``searchbench.archive``, under ``DIR/<config>/``), small enough for git;
``--restore DIR`` on a machine of the same target puts them back (libraries rebuilt; runs
tuned for another CPU refused), and the same command then runs only what is left. The
leave-out cost models are pretrained again there, and the libraries timed again together.

    .venv/bin/python bench/adatune_ablation.py --configs baseline full --archive /tmp/ada
    tar cJf bench/results/adatune_ablation_<cpu>_runs.tar.xz -C /tmp ada
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from adatunebench.layout import CONFIGS, AdaLayout, layout_of, plan
from searchbench import driver
from searchbench.layout import RunSpec, add_work_and_out, resolve_out, write_json
from searchbench.models import MODELS, ROOT

STEM = "adatune_ablation"
SCRIPT = Path(__file__).resolve()
DEFAULT_MODELS = ("dcgan_like", "resnet18_like", "mbconv_se", "bert_block")
HELD_OUT_NEEDED = 2  # models in no zoo the cost model was pretrained on


DEFAULT_WORK = ROOT / "bench" / "work"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=300.0, help="seconds per run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per configuration and model")
    parser.add_argument(
        "--models", nargs="+", default=None, metavar="MODEL",
        help=f"of {', '.join(MODELS)} (default: {' '.join(DEFAULT_MODELS)})",
    )  # fmt: skip
    parser.add_argument("--configs", nargs="+", default=None, metavar="CONFIG",
                        help=f"of {', '.join(CONFIGS)} (default: all)")  # fmt: skip
    add_work_and_out(parser, DEFAULT_WORK)
    parser.add_argument("--render", action="store_true", help="only re-analyse saved results")
    # Internal: the steps the orchestrator runs in subprocesses.
    parser.add_argument("--config", default="baseline", help=argparse.SUPPRESS)
    step = parser.add_mutually_exclusive_group()
    step.add_argument("--one", nargs=3, metavar=("MODEL", "SEARCHER", "REPEAT"),
                      help=argparse.SUPPRESS)  # fmt: skip
    step.add_argument("--prepare", metavar="MODEL", help=argparse.SUPPRESS)
    step.add_argument("--time", metavar="MODEL", help=argparse.SUPPRESS)
    step.add_argument(
        "--archive", type=Path, metavar="DIR",
        help="copy the finished runs (result, best record per workload) of --configs to DIR, "
        "for git",
    )  # fmt: skip
    step.add_argument(
        "--restore", type=Path, metavar="DIR",
        help="put the archived runs of --configs back into --work (libraries rebuilt), then stop",
    )  # fmt: skip
    args = parser.parse_args(argv)
    resolve_out(args, DEFAULT_WORK)
    return args


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments, in one line; None if nothing."""
    unknown = [m for m in args.models or [] if m not in MODELS]
    if unknown:
        return f"unknown model {', '.join(unknown)} (choose from {', '.join(MODELS)})"
    configs = [*(args.configs or []), args.config]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        return f"unknown configuration {', '.join(unknown)} (choose from {', '.join(CONFIGS)})"
    if args.budget <= 0 or args.repeats < 1:
        return "--budget must be positive and --repeats at least 1"
    return None


def time_model(layouts: dict[str, AdaLayout], model: str) -> None:
    """Child: every configuration's final library of ``model``, timed interleaved."""
    from searchbench.timing import final_libraries, timed

    any_layout = next(iter(layouts.values()))
    found = final_libraries(layouts, model)
    write_json(any_layout.timing(model), timed(model, found, any_layout.work))


def timing_stale(layouts: dict[str, AdaLayout], model: str) -> bool:
    from searchbench.timing import final_libraries

    wanted = sorted(final_libraries(layouts, model))
    path = next(iter(layouts.values())).timing(model)
    if not path.is_file():
        return bool(wanted)
    return sorted(json.loads(path.read_text())["ms"]) != wanted


def render(layouts: dict[str, AdaLayout], runs: list, models: list[str], out: Path) -> dict:
    from adatunebench import analysis

    data = analysis.gather(layouts, runs, models)
    summary = analysis.summary_line(data, analysis.accuracy_check(out))
    text = analysis.markdown(data, summary, list(layouts))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{STEM}.md").write_text(text)
    write_json(out / f"{STEM}.json", {"data": data, "summary": summary})
    analysis.plot(data, layouts, runs, out / STEM)
    return {"text": text, "summary": summary}


def one(args: argparse.Namespace, layout: AdaLayout) -> int:
    """Child: one tuning run; its result (or its error) goes to result.json."""
    from searchbench import run

    spec = RunSpec(args.one[0], args.one[1], int(args.one[2]))
    return driver.child(layout, spec, lambda: run.run(spec, layout) | {"config": layout.config})


def orchestrate(layouts: dict[str, AdaLayout], runs: list, models: list[str], out: Path) -> bool:
    """Every unfinished run in order, each in a child; the report after each. False if
    interrupted."""
    children = driver.Children(SCRIPT)
    children.install()
    first = next(iter(layouts.values()))
    try:
        driver.ensure_features(children, first)
        for config, spec in runs:
            layout = layouts[config]
            if layout.finished(spec):
                continue
            if "error" in driver.ensure_prepared(children, layout, spec.model):
                continue
            driver.run_job(children, layout, spec)
            render(layouts, runs, models, out)
        for model in models:
            if timing_stale(layouts, model):
                log = first.base / "logs" / f"{model}-timing.log"
                children.run(["--time", model, *first.child_args()], log, timeout=3600)
    except driver.Interrupted:
        print("adatune_ablation: interrupted; rerun the same command to resume", flush=True)
        return False
    return True


def carry(layouts: dict[str, AdaLayout], archive_to: Path | None, restore_from: Path | None) -> int:
    """``--archive``/``--restore``: the search benchmark's, one configuration at a time, each
    under ``DIR/<config>``. Restore skips a configuration the archive does not hold, so one
    archive can grow by configurations over sessions."""
    from searchbench import archive

    for config, layout in layouts.items():
        if archive_to is not None:
            archive.archive(layout, archive_to)
        elif (restore_from / config).is_dir():
            archive.restore(layout, restore_from)
        else:
            print(f"adatune_ablation: {config}: not in {restore_from}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    problem = check(args)
    if problem:
        print(f"adatune_ablation: {problem}", file=sys.stderr)
        return 2
    work = args.work.resolve()
    # A child asked to stop by SIGTERM stops as on Ctrl-C: between batches, fleet shut down.
    signal.signal(signal.SIGTERM, lambda *_: signal.raise_signal(signal.SIGINT))
    configs = args.configs or list(CONFIGS)
    layouts = {c: layout_of(work, args.budget, c) for c in configs}
    if args.one:
        return one(args, layout_of(work, args.budget, args.config))
    if args.prepare:
        from search_efficiency import prepare_child

        return prepare_child(args, layout_of(work, args.budget, args.config))
    if args.time:
        time_model({c: layout_of(work, args.budget, c) for c in CONFIGS}, args.time)
        return 0
    if args.archive or args.restore:
        return carry(layouts, args.archive, args.restore)
    models = list(dict.fromkeys(args.models or DEFAULT_MODELS))
    held_out = [m for m in models if MODELS[m].zoo_name is None]
    if len(held_out) < HELD_OUT_NEEDED and not args.render:
        print(f"adatune_ablation: note: {len(held_out)} of the models are in no zoo; the "
              f"issue asks for {HELD_OUT_NEEDED}", flush=True)  # fmt: skip
    runs = plan(models, args.repeats, configs)
    for config, layout in [] if args.render else layouts.items():
        # A configuration names GradientConfig overrides; the rest are today's defaults, which
        # move: its unfinished runs must search like its finished ones.
        mixed = layout.mixed_config([s for c, s in runs if c == config], ("gradient",))
        if mixed:
            print(f"adatune_ablation: {mixed}; use another --work", file=sys.stderr)
            return 2
    completed = True
    if not args.render:
        completed = orchestrate(layouts, runs, models, args.out)
    rendered = render(layouts, runs, models, args.out)
    print(rendered["text"])
    print(json.dumps(rendered["summary"]))
    return 0 if args.render or completed else 130


if __name__ == "__main__":
    sys.exit(main())
