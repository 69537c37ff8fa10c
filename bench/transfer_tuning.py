"""Transfer-tuning on this CPU (issue 16): how much of full tuning a schedule library gives
with no search, and how much sooner a warm-started search reaches what a cold one reaches.

Protocol (the parts live in bench/transferbench/; models, preparation, the run machinery, the
interleaved timing and the archive are the search-efficiency benchmark's, bench/searchbench/):

1. **Models** (``searchbench.models``): the four examples (zoo models) and four in no zoo
   (bench/models/). Each model's gradient search uses its leave-out cost model
   (``searchbench.prepare``: pretrained without the model's workloads; overlap asserted 0).
2. **Runs** (``transferbench.layout``), each in a fresh subprocess:
   ``untuned``; ``full``: ``gradtune tune`` with budget B (the cold run, too); ``transfer``:
   ``gradtune transfer`` from a library of the *other* models' ``full`` repeat-0 databases,
   the source chosen by Eq. 1, no search; ``warm``: ``gradtune tune --warm-start`` with that
   library and budget B. ``full`` and ``warm`` are repeated (seed = repeat). Order: every
   model's untuned and full run first (they are the libraries), then transfers and first warm
   starts, then the other repeats with full and warm alternating. A ``full`` run that
   ``bench/search_efficiency.py`` already made in the same work dir (its default gradient run
   of the model at the same budget and seed: the same call, cost model and seed) is adopted
   instead of repeated (``transferbench.step.adopt``; ``adopted_from`` in its result), so
   running both benchmarks at one budget (``--budget 480``) saves the full runs' hours.
3. **Timing** (``searchbench.timing``): every library a model's runs built (the model as tuned
   by B, outputs verified) timed interleaved in one process.
4. **Metrics** (``transferbench.analysis``): (a) the transfer's share of full tuning's speedup
   over untuned, and full tuning's time over the transfer's; (b) the time cold tuning took to
   reach its final (estimated) latency over the time the warm start took.

    .venv/bin/python bench/transfer_tuning.py [--budget 300] [--repeats 3] [--models ...]
    nohup nice -n 19 .venv/bin/python bench/transfer_tuning.py > /tmp/transfer.log 2>&1 &
    .venv/bin/python bench/transfer_tuning.py --render       # re-analyse the saved runs
    .venv/bin/python bench/transfer_tuning.py --warmup skip  # warm runs' warm-up ablation
    .venv/bin/python bench/transfer_tuning.py --warm-config warm_warmup=8

An ablation of the warm runs (``--warmup``, the task scheduler's warm-up, ``gradtune tune``'s
default after a warm start being ``stake``; ``--warm-from auto``, Eq. 1's source alone, where
the default is every source together; ``--warm-config``, GradientConfig fields of the warm
runs' search alone) makes only warm runs; its untuned, full and transfer
runs are the default's, copied in once finished, so every warm start is weighed against the
same cold runs.

Interrupted (Ctrl-C, ``kill PID``), the same command resumes: finished runs are kept, a
half-finished one is restarted. ``--archive DIR`` / ``--restore DIR`` carry finished runs
between machines (``searchbench.archive``). Writes ``--out``/transfer_tuning.{md,json}
(marked PARTIAL until every run finished); the last line printed is the JSON summary
``{"models": {name: {"fraction_of_full_speedup", "time_ratio", "warm_start_t_ratio"}},
"mean_fraction_of_full_speedup", "geomean_time_ratio", "geomean_warm_start_t_ratio"}``.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from searchbench import driver
from searchbench.layout import RunSpec, add_work_and_out, resolve_out
from searchbench.models import MODELS, ROOT
from transferbench.layout import (
    FROM_DEFAULT,
    FULL,
    KINDS,
    WARM,
    WARM_DEFAULT,
    TransferLayout,
    plan,
)

from gradtune.search import WARMUPS

STEM = "transfer_tuning"
SCRIPT = Path(__file__).resolve()


DEFAULT_WORK = ROOT / "bench" / "work"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=300.0, help="seconds per tuning run")
    parser.add_argument("--repeats", type=int, default=3, help="full and warm runs per model")
    parser.add_argument("--models", nargs="+", default=None, metavar="MODEL",
                        help=f"of {', '.join(MODELS)} (default: all)")  # fmt: skip
    add_work_and_out(parser, DEFAULT_WORK)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--render", action="store_true", help="only re-analyse saved results")
    mode.add_argument(
        "--archive",
        type=Path,
        metavar="DIR",
        help="write every finished run to DIR (small enough for git), then stop",
    )
    mode.add_argument(
        "--restore",
        type=Path,
        metavar="DIR",
        help="put archived runs back into --work (libraries rebuilt), then stop",
    )
    # Internal: the steps the orchestrator runs in subprocesses.
    mode.add_argument("--one", nargs=3, metavar=("MODEL", "KIND", "REPEAT"), help=argparse.SUPPRESS)
    mode.add_argument("--prepare", metavar="MODEL", help=argparse.SUPPRESS)
    mode.add_argument("--time", metavar="MODEL", help=argparse.SUPPRESS)
    parser.add_argument(
        "--gradient-config", default="", metavar="K=V,...",
        help="GradientConfig fields for the full and warm runs' gradient search "
             "(structural_variants=0); its runs live apart, in <budget>s-transfer-<config>",
    )  # fmt: skip
    parser.add_argument(
        "--warmup", default=WARM_DEFAULT, metavar="|".join(WARMUPS),
        help="the warm runs' task-scheduler warm-up (gradtune tune --warmup); another than "
             f"{WARM_DEFAULT} lives apart, in <budget>s-transfer-warmup-<warmup>, with the "
             "other kinds of run copied in from the default's",
    )  # fmt: skip
    parser.add_argument(
        "--warm-from", default=FROM_DEFAULT, metavar="all|auto",
        help="the warm runs' source (gradtune tune --from): every source together, or "
             f"Eq. 1's; another than {FROM_DEFAULT} lives apart, in "
             "<budget>s-transfer-from-<source>, like --warmup",
    )  # fmt: skip
    parser.add_argument(
        "--warm-config", default="", metavar="K=V,...",
        help="GradientConfig fields for the warm runs' search alone (warm_warmup=8); "
             "they live apart, in <budget>s-transfer-warm-<config>, like --warmup",
    )  # fmt: skip
    args = parser.parse_args(argv)
    resolve_out(args, DEFAULT_WORK)
    return args


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments, in one line; None if nothing."""
    unknown = [m for m in args.models or [] if m not in MODELS]
    if unknown:
        return f"unknown model {', '.join(unknown)} (choose from {', '.join(MODELS)})"
    if args.models is not None and len(set(args.models)) < 2:
        return "--models needs at least two: each model's library is the others' tuned models"
    if args.budget <= 0 or args.repeats < 1:
        return "--budget must be positive and --repeats at least 1"
    if args.warm_from not in ("auto", "all"):
        return f"unknown --warm-from {args.warm_from!r}; choose auto or all"
    if args.warmup not in WARMUPS:
        return f"unknown --warmup {args.warmup!r}; choose one of {', '.join(WARMUPS)}"
    if args.one and (args.one[0] not in MODELS or args.one[1] not in KINDS):
        return f"--one MODEL KIND REPEAT: KIND one of {', '.join(KINDS)}"
    return None


def models_of(args: argparse.Namespace) -> list[str]:
    return list(dict.fromkeys(args.models or MODELS))


def render(layout: TransferLayout, specs: list[RunSpec], models: list[str], out: Path) -> dict:
    from searchbench import api
    from transferbench import analysis, report

    data = analysis.gather(layout, specs, models)
    text = report.write(data, out, STEM, api.host_target()[0])
    return {"text": text, "summary": analysis.summary_line(data)}


def one(args: argparse.Namespace, layout: TransferLayout) -> int:
    """Child: one run; its result (or its error) goes to result.json."""
    from transferbench import step

    model, kind, repeat = args.one
    spec = RunSpec(model, kind, int(repeat))
    return driver.child(layout, spec, lambda: step.run(spec, layout))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    problem = check(args)
    if problem:
        print(f"transfer_tuning: {problem}", file=sys.stderr)
        return 2
    layout = TransferLayout(
        args.work.resolve(),
        args.budget,
        args.gradient_config,
        warmup=args.warmup,
        warm_from=args.warm_from,
        warm_config=args.warm_config,
    )
    if problem := layout.config_problem():
        print(f"transfer_tuning: {problem}", file=sys.stderr)
        return 2
    # A child asked to stop by SIGTERM stops as on Ctrl-C: between batches, fleet shut down.
    signal.signal(signal.SIGTERM, lambda *_: signal.raise_signal(signal.SIGINT))
    if args.one:
        return one(args, layout)
    if args.prepare:
        from search_efficiency import prepare_child

        return prepare_child(args, layout)
    if args.time:
        from searchbench.timing import time_model

        time_model(layout, args.time)
        return 0
    if args.archive or args.restore:
        from searchbench import archive

        if args.archive:
            archive.archive(layout, args.archive)
        else:
            archive.restore(layout, args.restore)
        return 0
    models = models_of(args)
    specs = plan(models, args.repeats)
    mixed = None if args.render else layout.mixed_config(specs, (FULL, WARM))
    if mixed:
        hint = "name it with --gradient-config, --warm-config or --warmup, or use another --work"
        print(f"transfer_tuning: {mixed}; {hint}", file=sys.stderr)
        return 2
    completed = True
    if not args.render:
        completed = driver.run_all(
            layout, specs, lambda: render(layout, specs, models, args.out), script=SCRIPT
        )
    rendered = render(layout, specs, models, args.out)
    print(rendered["text"])
    print(json.dumps(rendered["summary"]))
    return 0 if args.render or completed else 130


if __name__ == "__main__":
    sys.exit(main())
