"""Lowering options: do weight prepacking, fast math and NHWC give faster kernels on this CPU?

Issue 19 asks what the search space and the compilation lack against ONNX Runtime. Three
lowering options (``gradtune.partition.Lowering``) change what is tuned, and this benchmark
weighs each against the plain lowering, nothing else changed:

- ``prepack``: weights marked layout-free, so MetaSchedule's ``RewriteLayout`` postprocessor
  may store each in the order the tuned loop nest reads it (Ansor's idea; ONNX Runtime's MLAS
  prepacks its convolution weights too), folded into the constants at compile time.
- ``fast_math``: sigmoid (and SiLU) legalized as ``1 / (1 + fast_exp(-x))``, exp and softmax
  with ``fast_exp``, erf (GELU) and tanh as ``fast_erf`` / ``fast_tanh``, vectorizable, instead
  of one scalar libm call per element.
- ``prepack+fast_math``: both.
- ``nhwc``: 2-D convolutions and what follows them in NHWC (weights HWIO) by Relax's
  ``ConvertLayout``, so the output channels are the contiguous innermost axis a vector spans;
  ``nhwc+fast_math`` with fast math too.
- ``subpixel``: 2-D transposed convolutions as one dense convolution over their output phases
  (``gradtune/subpixel.py``) instead of TOPI's convolution over the input spread out with
  zeros; each keeps its kernel's name and the sizes of its data, weights and output whenever
  the stride divides the kernel (DCGAN's 4×4 stride-2 layers do), so its kernels match.

Protocol:

1. **Models** (``searchbench.models``): by default mbconv_se (in no zoo; depthwise and 1×1
   convolutions with SiLU, a squeeze-excitation head) and bert_block (in no zoo; dense layers).
2. **Tasks**: the ``--tasks`` tasks with the most FLOPs (weight × FLOPs per call) in the plain
   lowering. An option changes a kernel's body or its arguments' layout, not the fusion, so
   each variant tunes the same kernels, found by their arguments' extents (sorted: a layout
   permutes them) and their operator sequence without the approximated function's prefix
   (``tir_sigmoid`` / ``fast_sigmoid``).
   Neither a variant's own FLOP rank (fast_exp adds FLOPs) nor the task order (it differs)
   would do.
3. **Runs**: per (model, variant, repeat), in a fresh process, from an empty database:
   ``tune`` of those tasks with ``--search`` (MetaSchedule's evolutionary search by default:
   the question is the design space, not gradtune's search) and ``--trials`` trials per task,
   seed = repeat, the CLI's builder, local RPC fleet and batch. The variant going first
   rotates from one repeat to the next. The whole model is then compiled with the database
   (the other tasks untuned, in their variant's lowering), its outputs checked, its library
   exported.
4. **Metrics**: per task, the median over repeats of the best measured µs, and the ratio
   plain / variant; per model and variant, the geomean of those ratios, and the end-to-end ms
   of every library and of ONNX Runtime (on the target's core count), timed interleaved in
   one process, medians over repeats.

    .venv/bin/python bench/lowering.py [--models mbconv_se bert_block] [--tasks 3]
                                       [--trials 64] [--repeats 3]
                                       [--variants prepack fast_math]
    .venv/bin/python bench/lowering.py --render    # re-analyse the saved runs
    .venv/bin/python bench/lowering.py --models bert_block --operator softmax --variants fast_math

``--operator NAME`` tunes the kernels whose operators include NAME instead (up to ``--tasks``
of them, most FLOPs first): a kernel of few FLOPs, such as a softmax, can still be much of a
model's time. Its runs and results (``lowering_NAME.{md,json}``) are kept apart; so are the
results of other ``--variants`` than the default pair (``lowering_nhwc.{md,json}``).
``--stride S`` tunes only the 2-D convolutions of stride S (``lowering_stride2_nhwc.{md,json}``):
a stride-2 convolution reads every other input column, so the plain layout's vector over the
output's columns becomes a strided load, while NHWC's or NCHWc's vector over output channels
does not.

Resumable: a finished run's ``result.json`` is kept; a run without one is redone from
nothing. Writes ``--out``/lowering.{md,json} (PARTIAL until every run finished); the last line
printed is one JSON object: ``{"models": {name: {variant: {"kernel_ratio", "e2e_ratio"},
"e2e_ms", "repeats"}}, "geomean_kernel_ratio": {variant: r}, "geomean_e2e_ratio": {variant:
r}, "partial", "commit"}`` (ratios plain / variant: above 1 the variant is faster).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from searchbench.analysis import geomean
from searchbench.layout import add_work_and_out, resolve_out, write_json
from searchbench.models import MODELS, ROOT
from searchbench.report import conditions, git_commit, machine

BASELINE = "plain"
# Variant → Lowering fields, every field given (the defaults move); plain, libm's functions
# and plain weights, is every variant's baseline and always runs.
_PLAIN = {
    "weight_prepack": False, "fast_math": False, "conv_layout": "NCHW", "fold_batchnorm": False,
    "subpixel_conv_transpose": False,
}  # fmt: skip
VARIANTS = {
    BASELINE: _PLAIN,
    "prepack": {**_PLAIN, "weight_prepack": True},
    "fast_math": {**_PLAIN, "fast_math": True},
    "prepack+fast_math": {**_PLAIN, "weight_prepack": True, "fast_math": True},
    "nhwc": {**_PLAIN, "conv_layout": "NHWC"},
    "nhwc+fast_math": {**_PLAIN, "conv_layout": "NHWC", "fast_math": True},
    "nchwc": {**_PLAIN, "conv_layout": "NCHWc"},
    "nchwc+fast_math": {**_PLAIN, "conv_layout": "NCHWc", "fast_math": True},
    "fold_bn": {**_PLAIN, "fold_batchnorm": True},
    "fold_bn+fast_math": {**_PLAIN, "fold_batchnorm": True, "fast_math": True},
    "subpixel": {**_PLAIN, "subpixel_conv_transpose": True},
}
DEFAULT_VARIANTS = ("prepack", "fast_math")
DEFAULT_MODELS = ("mbconv_se", "bert_block")
ORT = "ONNX Runtime"


DEFAULT_WORK = ROOT / "bench" / "work" / "lowering"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), metavar="MODEL",
                        help=f"of {', '.join(MODELS)}")  # fmt: skip
    others = ", ".join(list(VARIANTS)[1:])
    parser.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS), metavar="VARIANT",
                        help=f"weighed against plain; of {others}")  # fmt: skip
    parser.add_argument("--tasks", type=int, default=3, help="tasks tuned per model")
    parser.add_argument("--operator", default=None, metavar="NAME",
                        help="tune kernels whose operators include NAME (softmax)")  # fmt: skip
    parser.add_argument("--stride", type=int, default=None, metavar="S",
                        help="tune the 2-D convolutions of stride S only (2: the downsampling "
                        "ones)")  # fmt: skip
    parser.add_argument("--trials", type=int, default=64, help="trials per task")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--search", default="evolutionary", choices=("evolutionary", "gradient"))
    add_work_and_out(parser, DEFAULT_WORK)
    parser.add_argument("--render", action="store_true", help="only re-analyse saved runs")
    parser.add_argument("--one", nargs=3, metavar=("MODEL", "VARIANT", "REPEAT"),
                        help=argparse.SUPPRESS)  # fmt: skip
    parser.add_argument("--time", metavar="MODEL", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    resolve_out(args, DEFAULT_WORK)
    return args


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments, in one line; None if nothing."""
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        return f"unknown model {', '.join(unknown)} (choose from {', '.join(MODELS)})"
    others = list(VARIANTS)[1:]
    wrong = [v for v in args.variants if v not in others]
    if wrong:
        return f"unknown variant {', '.join(wrong)} (choose from {', '.join(others)})"
    if min(args.tasks, args.trials, args.repeats) < 1:
        return "--tasks, --trials and --repeats must be at least 1"
    if args.stride is not None and args.stride < 1:
        return "--stride must be at least 1"
    return None


def variants(args: argparse.Namespace) -> list[str]:
    """plain, then the asked-for variants, each once."""
    return [BASELINE, *dict.fromkeys(v for v in args.variants if v != BASELINE)]


def root(args: argparse.Namespace) -> Path:
    """Runs of one setting live apart from any other's."""
    which = f"{args.operator}-" if args.operator else ""
    which += f"stride{args.stride}-" if args.stride else ""
    return args.work / f"{args.search}-{which}{args.tasks}tasks-{args.trials}trials"


def run_dir(args: argparse.Namespace, model: str, variant: str, repeat: int) -> Path:
    return root(args) / model / f"{variant}-r{repeat}"


def plan(args: argparse.Namespace) -> list[tuple[str, str, int]]:
    """(model, variant, repeat): repeat-major, the variant going first rotating."""
    names = variants(args)
    runs = []
    for repeat in range(args.repeats):
        for i, model in enumerate(args.models):
            shift = (i + repeat) % len(names)
            runs += [(model, variant, repeat) for variant in names[shift:] + names[:shift]]
    return runs


# --------------------------------------------------------------------------- one run (child)


def ranked(
    tasks: list[Any], count: int, operator: str | None = None, stride: int | None = None
) -> list[Any]:
    """The ``count`` tasks with the most FLOPs per inference, largest first; with
    ``operator``, only tasks of which it is one of the operators; with ``stride``, only 2-D
    convolutions of that stride."""
    if operator:
        tasks = [t for t in tasks if operator in kernel_key(t)[0].split("+")]
    if stride:
        tasks = [t for t in tasks if conv_stride(t) == stride]
    return sorted(tasks, key=lambda t: (-t.weight * t.flops, t.kernel_class))[:count]


def arg_shapes(task: Any) -> list[tuple[int, ...]]:
    """The shapes of a kernel's arguments, in its PrimFunc's order."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    return [tuple(int(d) for d in arg.shape) for arg in ArgInfo.from_prim_func(task.mod["main"])]


def conv_stride(task: Any) -> int | None:
    """A plain (NCHW) 2-D convolution kernel's stride: its data's height over its output's,
    rounded down (padding and the window change them by less than a stride); None for
    another kernel. Fusion keeps the convolution's data first and its output last."""
    if "conv2d" not in task.kernel_class.split("+"):
        return None
    shapes = arg_shapes(task)
    data, out = shapes[0], shapes[-1]
    if len(data) != 4 or len(out) != 4 or out[2] == 0:
        return None
    return data[2] // out[2]


def kernel_key(task: Any) -> tuple:
    """What names a kernel in every lowering: its operators without the prefix an
    approximation adds or drops (``tir+sigmoid`` / ``fast+sigmoid``) and with a BatchNorm's
    decomposition as the bias ``add`` its folding leaves, a blocked convolution as a
    convolution; and the sizes of its data, weights and output: another data layout permutes
    or blocks their extents (NCHW / NHWC / NCHW8c, weights OIHW / HWIO / OIHW8i8o), never their
    sizes. The per-channel constants between them differ when BatchNorm is folded."""
    import math
    import re

    ops = re.sub(r"\b(tir|fast)\+", "", task.kernel_class).replace("conv2d_NCHWc", "conv2d")
    ops = ops.replace("subtract+divide+multiply+add", "add")
    sizes = [math.prod(shape) for shape in arg_shapes(task)]
    return ops, tuple(sizes[:2] + sizes[-1:])


def same_kernels(plain: list[Any], tasks: list[Any], chosen: list[Any]) -> list[Any]:
    """The tasks of ``tasks`` (one variant) that are the kernels ``chosen`` of ``plain``."""
    by_key: dict[tuple, list[Any]] = {}
    for task in tasks:
        by_key.setdefault(kernel_key(task), []).append(task)
    found = []
    for task in chosen:
        matches = by_key.get(kernel_key(task), [])
        if len(matches) != 1:
            raise RuntimeError(f"{task.name}: {len(matches)} kernels of the variant match it")
        found.append(matches[0])
    return found


def one(args: argparse.Namespace, model: str, variant: str, repeat: int) -> dict[str, Any]:
    from searchbench import api

    from gradtune import compilation
    from gradtune.measure.rpc_fleet import LocalFleet
    from gradtune.partition import Lowering, extract, measure_untuned, prepare
    from gradtune.tune import best_from_database, compile_database, run_database, tune

    commit = git_commit()  # the code that runs, whatever is committed while it does
    config, target = api.host_target()
    imported = api.import_model(MODELS[model].tuning_file(args.work))
    exact = Lowering(**VARIANTS[BASELINE])
    plain = extract(prepare(imported.mod, imported.params, target, exact), target)
    fused = prepare(imported.mod, imported.params, target, Lowering(**VARIANTS[variant]))
    chosen = ranked(plain, args.tasks, args.operator, args.stride)
    chosen = same_kernels(plain, extract(fused, target), chosen)
    if not chosen:
        asked = {"--operator": args.operator, "--stride": args.stride}
        raise RuntimeError(
            f"{model}: no kernel matches " + " ".join(f"{k} {v}" for k, v in asked.items() if v)
        )
    measure_untuned(chosen, target)
    out = run_dir(args, model, variant, repeat)
    start = time.perf_counter()
    with LocalFleet() as tracker:
        result = tune(chosen, target, out / "db", tracker, max_trials=args.trials * len(chosen),
                      search=args.search, seed=repeat)  # fmt: skip
    seconds = time.perf_counter() - start
    database = run_database(out / "db")
    best = best_from_database(database, chosen)
    executable = compilation.build(fused, target, compile_database(out / "db"))
    runner = compilation.Runner(executable, target, imported.inputs)
    error = compilation.verify(runner.outputs(), imported.reference_outputs, f"{model} {variant}")
    compilation.export(executable, out / "model.so")
    return {
        "model": model, "variant": variant, "repeat": repeat, "search": args.search,
        "target": config,
        "tasks": [
            {"rank": i, "name": t.name, "kernel_class": t.kernel_class, "weight": t.weight,
             "mflops": round(t.flops / 1e6, 3), "untuned_us": t.untuned_us,
             "best_us": best.get(t.name)}
            for i, t in enumerate(chosen)
        ],
        "trials": result.trials, "tuning_seconds": round(seconds, 1), "max_abs_err": error,
        "library": "model.so", "commit": commit,
    }  # fmt: skip


def time_model(args: argparse.Namespace, model: str) -> dict[str, Any]:
    """Child: every finished run's library of ``model`` and ONNX Runtime, interleaved."""
    from searchbench import api

    from gradtune import peers
    from gradtune.pipeline import peer_threads

    config, target = api.host_target()
    imported = api.import_model(MODELS[model].tuning_file(args.work))
    libraries = {
        f"{variant}-r{repeat}": run_dir(args, model, variant, repeat) / "model.so"
        for m, variant, repeat in plan(args)
        if m == model and (run_dir(args, model, variant, repeat) / "result.json").is_file()
    }
    threads = peer_threads(config)
    feed = dict(zip(imported.input_names, imported.inputs, strict=True))
    onnx_bytes, onnx_error = peers.onnx_of(imported)
    ort = peers.checked(ORT, lambda: peers.ort_runner(onnx_bytes, feed, threads), imported,
                        onnx_error)  # fmt: skip
    extra = {ORT: ort.run} if ort.run is not None else {}
    timing = api.time_libraries(libraries, imported.inputs, target, extra)
    return {"model": model, "ms": timing.medians(), "timing": timing.conditions(),
            "ort_error": ort.error, "threads": threads,
            "date": time.strftime("%Y-%m-%dT%H:%M:%S")}  # fmt: skip


# --------------------------------------------------------------------------- orchestration


def child(args: argparse.Namespace, extra: list[str], log: Path) -> int:
    argv = [sys.executable, str(Path(__file__).resolve()), "--work", str(args.work),
            "--tasks", str(args.tasks), "--trials", str(args.trials), "--search", args.search,
            "--repeats", str(args.repeats), "--models", *args.models,
            "--variants", *args.variants, *extra]  # fmt: skip
    if args.operator:
        argv += ["--operator", args.operator]
    if args.stride:
        argv += ["--stride", str(args.stride)]
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as out:
        return subprocess.run(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT).returncode


def orchestrate(args: argparse.Namespace) -> None:
    for model, variant, repeat in plan(args):
        out = run_dir(args, model, variant, repeat)
        if (out / "result.json").is_file():
            continue
        shutil.rmtree(out, ignore_errors=True)  # half a run: from nothing, so trials are equal
        print(f"{model} {variant}-r{repeat}: tuning", flush=True)
        code = child(args, ["--one", model, variant, str(repeat)], out.parent / "logs.txt")
        if not (out / "result.json").is_file():
            print(f"{model} {variant}-r{repeat}: failed (exit {code}); see {out.parent}/logs.txt",
                  flush=True)  # fmt: skip
    for model in args.models:
        print(f"{model}: timing the libraries and ONNX Runtime interleaved", flush=True)
        child(args, ["--time", model], root(args) / model / "logs.txt")


# --------------------------------------------------------------------------- results


def median_or_none(values: list[float]) -> float | None:
    values = [v for v in values if v]
    return statistics.median(values) if values else None


def ratio(plain: float | None, variant: float | None) -> float | None:
    return plain / variant if plain and variant else None


def task_rows(results: dict[tuple[str, int], dict], count: int, names: list[str]):
    """Per task rank: each variant's median best µs over its runs, and plain / variant."""
    rows = []
    for rank in range(count):
        found = [(v, r["tasks"][rank]) for (v, _), r in results.items() if rank < len(r["tasks"])]
        if not found:
            continue
        # The plain run's name for the kernel: a variant may rename it (fast_sigmoid).
        first = next((t for v, t in found if v == BASELINE), found[0][1])
        row: dict[str, Any] = {"kernel_class": first["kernel_class"], "mflops": first["mflops"],
                               "us": {}, "runs": {}, "ratio": {}}  # fmt: skip
        for variant in names:
            best = [t["best_us"] for v, t in found if v == variant and t["best_us"]]
            row["us"][variant], row["runs"][variant] = median_or_none(best), len(best)
        for variant in names[1:]:
            row["ratio"][variant] = ratio(row["us"][BASELINE], row["us"][variant])
        rows.append(row)
    return rows


def gather(args: argparse.Namespace) -> dict[str, Any]:
    names = variants(args)
    data: dict[str, Any] = {"variants": names, "models": {}}
    commits: set[str] = set()
    target = None
    runs = plan(args)
    finished = 0
    for model in args.models:
        results = {}
        for m, variant, repeat in runs:
            path = run_dir(args, m, variant, repeat) / "result.json"
            if m == model and path.is_file():
                results[(variant, repeat)] = json.loads(path.read_text())
        finished += len(results)
        if not results:
            continue
        target = target or next(iter(results.values()))["target"]
        commits |= {r["commit"] for r in results.values()}
        tasks = task_rows(results, args.tasks, names)
        timing_path = root(args) / model / "timing.json"
        ms = json.loads(timing_path.read_text())["ms"] if timing_path.is_file() else {}
        e2e = {
            v: median_or_none([x for label, x in ms.items() if label.startswith(f"{v}-r")])
            for v in names
        }
        e2e[ORT] = ms.get(ORT)
        seconds = {
            v: median_or_none([r["tuning_seconds"] for (w, _), r in results.items() if w == v])
            for v in names
        }
        data["models"][model] = {
            "tasks": tasks,
            "kernel_ratio": {
                v: geomean([t["ratio"][v] for t in tasks if t["ratio"][v]]) for v in names[1:]
            },
            "e2e_ms": e2e,
            "e2e_ratio": {v: ratio(e2e[BASELINE], e2e[v]) for v in names[1:]},
            "repeats": min((n for t in tasks for n in t["runs"].values()), default=0),
            "tuning_seconds": seconds,
        }
    data["partial"] = finished < len(runs)
    data["commit"] = ", ".join(sorted(commits)) or git_commit()
    data["machine"] = machine(target)
    return data


def which(args: argparse.Namespace) -> str:
    kinds = [f"whose operators include {args.operator}"] if args.operator else []
    kinds += [f"2-D convolutions of stride {args.stride}"] if args.stride else []
    return f" of those {' and '.join(kinds)}" if kinds else ""


def stem(args: argparse.Namespace) -> str:
    """Results of other kernels (``--operator``), or of other variants than the default
    set, go to files of their own."""
    if args.stride:
        kind = f"{args.operator}_" if args.operator else ""
        names = "_".join(v.replace("+", "-") for v in args.variants)
        return f"lowering_{kind}stride{args.stride}_{names}"
    if args.operator:
        return f"lowering_{args.operator}"
    if sorted(args.variants) == sorted(DEFAULT_VARIANTS):
        return "lowering"
    return "lowering_" + "_".join(v.replace("+", "-") for v in args.variants)


def fmt(value: float | None, spec: str = ".2f") -> str:
    return "–" if value is None else format(value, spec)


def markdown(args: argparse.Namespace, data: dict[str, Any]) -> str:
    names = data["variants"]
    others = names[1:]
    lines = [
        "# Lowering options (weight prepacking, fast math, NHWC, BatchNorm folding, sub-pixel "
        "transposed convolutions) against the plain lowering"
        + (" (PARTIAL)" if data["partial"] else ""),
        "",
        conditions(data["commit"], data["machine"]) + f" Per model the {args.tasks} tasks with "
        f"the most FLOPs{which(args)}, tuned by {args.search} search for {args.trials} trials "
        f"each from an empty database, {args.repeats} repeats per variant; medians. Ratio = "
        "plain / variant: above 1 the variant is faster. End-to-end: the whole model compiled "
        "with that database (other tasks untuned, in their variant's lowering), every library "
        "and ONNX Runtime timed interleaved in one process.",
        "",
        "| model | task (rank by FLOPs) | MFLOP | "
        + " | ".join(f"{v} µs" for v in names)
        + " | "
        + " | ".join(f"plain / {v}" for v in others)
        + " |",
        "|---|---|---:|" + "---:|" * (len(names) + len(others)),
    ]
    for name, model in data["models"].items():
        for rank, t in enumerate(model["tasks"]):
            cells = [fmt(t["us"].get(v), ".1f") for v in names]
            cells += [fmt(t["ratio"].get(v)) for v in others]
            lines.append(f"| {name} | {rank}: {t['kernel_class']} | {t['mflops']:.2f} | "
                         + " | ".join(cells) + " |")  # fmt: skip
    lines += [
        "",
        "| model | variant | repeats | kernels: geomean plain / variant | e2e ms | "
        "e2e plain / variant | tuning s |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, model in data["models"].items():
        e2e, secs = model["e2e_ms"], model["tuning_seconds"]
        for v in names:
            kernels = fmt(model["kernel_ratio"].get(v)) if v != BASELINE else "1"
            e2e_ratio = fmt(model["e2e_ratio"].get(v)) if v != BASELINE else "1"
            lines.append(f"| {name} | {v} | {model['repeats']} | {kernels} | "
                         f"{fmt(e2e[v], '.4f')} | {e2e_ratio} | "
                         f"{fmt(secs.get(v), '.0f')} |")  # fmt: skip
        lines.append(f"| {name} | {ORT} | – | – | {fmt(e2e[ORT], '.4f')} | "
                     f"{fmt(ratio(e2e[BASELINE], e2e[ORT]))} | – |")  # fmt: skip
    return "\n".join(lines) + "\n"


def summary_line(data: dict[str, Any]) -> dict[str, Any]:
    models = data["models"]
    others = data["variants"][1:]
    return {
        "models": {
            name: {
                **{
                    v: {"kernel_ratio": m["kernel_ratio"][v], "e2e_ratio": m["e2e_ratio"][v]}
                    for v in others
                },
                "e2e_ms": m["e2e_ms"],
                "repeats": m["repeats"],
            }
            for name, m in models.items()
        },  # fmt: skip
        "geomean_kernel_ratio": {
            v: geomean([m["kernel_ratio"][v] for m in models.values() if m["kernel_ratio"][v]])
            for v in others
        },
        "geomean_e2e_ratio": {
            v: geomean([m["e2e_ratio"][v] for m in models.values() if m["e2e_ratio"][v]])
            for v in others
        },
        "partial": data["partial"],
        "commit": data["commit"],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    problem = check(args)
    if problem:
        print(f"lowering: {problem}", file=sys.stderr)
        return 2
    args.work = args.work.resolve()
    if args.one:
        model, variant, repeat = args.one
        result = one(args, model, variant, int(repeat))
        write_json(run_dir(args, model, variant, int(repeat)) / "result.json", result)
        return 0
    if args.time:
        write_json(root(args) / args.time / "timing.json", time_model(args, args.time))
        return 0
    if not args.render:
        try:
            orchestrate(args)
        except KeyboardInterrupt:
            print("lowering: interrupted; rerun the same command to resume", flush=True)
            return 130
    data = gather(args)
    text = markdown(args, data)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem(args)}.md").write_text(text)
    write_json(args.out / f"{stem(args)}.json", data)
    print(text)
    print(json.dumps(summary_line(data)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
