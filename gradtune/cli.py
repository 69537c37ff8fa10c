"""``gradtune`` command line: ``tune`` a model (or ``transfer`` schedules to it), ``retune``
changed ones, ``pull`` a registered one."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import subprocess
import sys
import traceback
import warnings
from pathlib import Path
from typing import NoReturn

from .entrypoints import load_flow
from .errors import GradtuneError
from .job import TuneJob


def _environment_defaults() -> None:
    # Ephemeral Prefect's first start in a new PREFECT_HOME takes ~18 s on 2 cores; the default
    # timeout is tighter than that. Analytics would phone out of a machine with no internet.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "gradtune")
    # Registering reads the stored files back (their digests, MLflow's own checks): a progress
    # bar per download nobody asked for. ``gradtune pull``, which is one, keeps its bars.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


class _DropUserErrors(logging.Filter):
    """Bad input is reported by the CLI in one line; Prefect's traceback of it is noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, GradtuneError):
            return False
        return "GradtuneError" not in record.getMessage()


def _quiet_prefect_user_errors() -> None:
    # Prefect's run loggers propagate to its console handler on the root logger; the API
    # handlers keep the full record for the Prefect UI.
    for handler in logging.getLogger().handlers:
        handler.addFilter(_DropUserErrors())


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one ``gradtune: error:`` line, like every other error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"gradtune: error: {self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from .search import WARMUPS  # imports no framework

    parser = OneLineParser(prog="gradtune", description=__doc__)
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an error, not just its line"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    tune = sub.add_parser("tune", help="tune a PyTorch (.py) or ONNX (.onnx) model")
    tune.add_argument("model", help="a .onnx file, or a .py file defining --entry")
    tune.add_argument("--trials", type=int, default=128, help="total measured trials")
    tune.add_argument(
        "--time-budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop tuning after this much wall-clock time",
    )
    tune.add_argument(
        "--search",
        default="gradient",
        help="gradient (Felix) | evolutionary | replay-trace | replay-func",
    )
    tune.add_argument(
        "--warm-start",
        default=None,
        metavar="SPEC",
        help="start the search from schedules transferred from a library (see transfer)",
    )
    tune.add_argument(
        "--from",
        default=None,
        metavar="all|auto|NAME@ALIAS|DIR",
        help="with --warm-start: the library's source (all, the default: every source's "
        "schedules together, each task's nearest in shape first; auto: the paper's Eq. 1)",
    )
    tune.add_argument(
        "--warmup",
        default=None,
        choices=WARMUPS,
        help="the task scheduler's first batches: one per task in the model's order (model), "
        "the most latency at stake first (stake), likewise but the tasks without transferred "
        "or resumed programs first (fresh), or none, every task with a measured program "
        "weighed from the start (skip); default: stake after --warm-start, else model",
    )
    add_run_options(tune)
    add_transfer_parser(sub)

    pull = sub.add_parser("pull", help="download a registered model and run it once")
    pull.add_argument("ref", metavar="NAME@ALIAS")
    pull.add_argument("--out", required=True, help="directory to download into")
    pull.add_argument("--mlflow-uri", default=os.environ.get("MLFLOW_TRACKING_URI"))
    pull.add_argument(
        "--allow-unverified",
        action="store_true",
        help="load a version registered without SHA-256 checksums (runs unverifiable code)",
    )

    symbolic = sub.add_parser("symbolic", help="symbolic schedules and feature formulas")
    symbolic_sub = symbolic.add_subparsers(dest="symbolic_command", required=True)
    verify = symbolic_sub.add_parser(
        "verify", help="check the feature formulas of a task against TVM's PerStoreFeature"
    )
    verify.add_argument("path", help="TVMScript file holding the task's IRModule / PrimFunc")
    verify.add_argument("--target", default=None, help="llvm (default: this CPU), cuda or JSON")
    verify.add_argument("--samples", type=int, default=20, help="random decisions per sketch")
    verify.add_argument("--seed", type=int, default=0)

    costmodel = sub.add_parser("costmodel", help="gradtune's cost model vs MetaSchedule's")
    costmodel_sub = costmodel.add_subparsers(dest="costmodel_command", required=True)
    evaluate = costmodel_sub.add_parser(
        "eval", help="rank held-out workloads: ours vs XGBModel vs MLPModel"
    )
    evaluate.add_argument("--dataset", default="data", help="dataset directory")
    evaluate.add_argument("--split", default="workload", choices=["workload", "model"])
    evaluate.add_argument("--target", default=None, help="the dataset's target (default: llvm)")
    evaluate.add_argument("--epochs", type=int, default=40)
    evaluate.add_argument(
        "--loss", default="both", choices=["rank", "mse", "both"], help="loss(es) of ours"
    )
    evaluate.add_argument("--out", default=None, help="also write costmodel_eval_<split>.md/.json")
    pretrain = costmodel_sub.add_parser(
        "pretrain", help="pretrain the cost model on a dataset (Prefect flow), register it"
    )
    pretrain.add_argument("--dataset", default="data", help="dataset directory")
    pretrain.add_argument("--features", default="features/llvm.pt", help="features file")
    pretrain.add_argument(
        "--weights", default="gradtune/costmodel/weights/llvm.pt", help="where to write weights"
    )
    pretrain.add_argument("--loss", default="rank", choices=["rank", "mse"])
    pretrain.add_argument("--epochs", type=int, default=40)
    pretrain.add_argument("--reuse-features", action="store_true", help="skip featurizing")
    pretrain.add_argument(
        "--mlflow-uri",
        default=os.environ.get("MLFLOW_TRACKING_URI"),
        help="register gradtune-costmodel-<target>@champion here",
    )

    add_dataset_parser(sub)
    add_register_parser(sub)
    add_retune_parser(sub)
    return parser  # fmt: skip


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """Options of every command that tunes a model into an output directory (tune, transfer)."""
    # The choices are those of the modules that act on them (neither imports a framework).
    from .measure.runner import MEASURE_MODES
    from .partition import CONV_LAYOUT_CHOICES

    parser.add_argument(
        "--entry",
        default="get_model",
        help="function in the .py file returning (nn.Module, example inputs)",
    )
    parser.add_argument(
        "--input-shape",
        action="append",
        metavar="NAME=D1,D2,...",
        help="shape of a dynamic ONNX input (repeatable)",
    )
    parser.add_argument(
        "--target", default=None, help="'llvm' (this CPU, default), 'cuda', or a JSON target object"
    )
    parser.add_argument("--out", default=None, help="output directory (default runs/<model>)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue in an existing output directory of the same model",
    )
    parser.add_argument(
        "--tracker",
        default=None,
        metavar="HOST:PORT",
        help="existing RPC tracker (default: start a local fleet)",
    )
    parser.add_argument("--key", default=None, help="device key on the tracker")
    parser.add_argument(
        "--rpc-servers",
        type=int,
        default=1,
        help="servers in the local fleet (1 keeps measurements uncontended)",
    )
    parser.add_argument(
        "--mlflow-uri",
        default=None,
        help="MLflow tracking URI (default: sqlite store in the output directory)",
    )
    parser.add_argument("--name", default=None, help="registered model name")
    parser.add_argument("--alias", default="champion", help="registered model alias")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--measure",
        default="fixed",
        choices=MEASURE_MODES,
        help="time candidates fixed (3 × 3 runs, ≥ 20 ms each), adaptively (until stable) or "
        "handoff (3 × 15 single runs, each after the thread pool rewrote the input, as the "
        "previous kernel leaves it in an inference; CPU only)",
    )
    parser.add_argument(
        "--confirm",
        type=int,
        default=0,
        metavar="K",
        help="after the search, time each task's K fastest programs and its default again, "
        "quietly, and ship the fastest (10%% of --time-budget; default 0: the recorded best)",
    )
    parser.add_argument(
        "--fast-math",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="exp, softmax, sigmoid/SiLU, erf/GELU and tanh by vectorizable approximations, "
        "not libm's scalar calls (default: on)",
    )
    parser.add_argument(
        "--weight-prepack",
        action="store_true",
        help="store weights in each tuned kernel's loop order, folded at compile time (CPU)",
    )
    parser.add_argument(
        "--conv-layout",
        default="NCHW",
        choices=CONV_LAYOUT_CHOICES,
        help="the data layout 2-D convolutions are tuned in; NHWC puts output channels "
        "innermost, where vectors span them; NCHWc (CPU) blocks channels by a vector "
        "register's lanes, each block innermost (default: NCHW, the model's own)",
    )
    parser.add_argument(
        "--fold-batchnorm",
        action="store_true",
        help="fold each BatchNorm after a 2-D convolution into its weights and a bias",
    )
    parser.add_argument(
        "--subpixel-conv-transpose",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="2-D transposed convolutions as one dense convolution over their output "
        "phases, not over their input spread out with zeros (default: on)",
    )


def add_transfer_parser(sub) -> None:
    transfer = sub.add_parser(
        "transfer",
        help="tune a model with no search: the schedules of models tuned before, transferred",
    )
    transfer.add_argument("model", help="a .onnx file, or a .py file defining --entry")
    transfer.add_argument(
        "--library",
        default="registry",
        metavar="SPEC",
        help="comma-separated run directories (or directories of them), NAME@ALIAS, and "
        "'registry': every gradtune model in the MLflow registry (default)",
    )
    transfer.add_argument(
        "--from",
        default="auto",
        metavar="auto|all|NAME@ALIAS|DIR",
        help="the source to transfer from (auto: the paper's Eq. 1 over the library; all: "
        "every source's schedules together, each task's nearest in shape first)",
    )
    add_run_options(transfer)

    library = sub.add_parser("library", help="the schedule library transfer-tuning reads")
    library_sub = library.add_subparsers(dest="library_command", required=True)
    ls = library_sub.add_parser("ls", help="what the library holds, per target and kernel class")
    ls.add_argument(
        "--mlflow-uri",
        default=os.environ.get("MLFLOW_TRACKING_URI"),
        help="the registry whose gradtune models are listed (default: MLFLOW_TRACKING_URI)",
    )
    ls.add_argument(
        "--from",
        action="append",
        default=[],
        metavar="DIR",
        help="a run directory, a directory of them, or NAME@ALIAS (repeatable)",
    )


def cmd_library(args: argparse.Namespace) -> int:
    items = list(getattr(args, "from"))
    if args.mlflow_uri:
        items.append("registry")
    if not items:
        raise GradtuneError("nothing to list: pass --mlflow-uri URI or --from DIR")
    from .transfer.library import describe, load_library

    for line in describe(load_library(",".join(items), args.mlflow_uri)):
        print(line)
    return 0


def add_register_parser(sub) -> None:
    register = sub.add_parser(
        "register", help="register a tuned output directory whose registration failed"
    )
    register.add_argument("out_dir", metavar="OUT_DIR", help="the tune's --out directory")
    register.add_argument(
        "--mlflow-uri", default=None, help="MLflow tracking URI (default: sqlite store in OUT_DIR)"
    )


def cmd_register(args: argparse.Namespace) -> int:
    from .pipeline import print_summary, register_run_dir

    _environment_defaults()
    print_summary(register_run_dir(Path(args.out_dir), args.mlflow_uri))
    return 0


# --------------------------------------------------------------------------- retune


def add_retune_parser(sub) -> None:
    from .measure.runner import MEASURE_MODES

    retune = sub.add_parser(
        "retune",
        help="retune the models whose fingerprint changed; promote a correct, no slower one",
    )
    retune.add_argument(
        "models", nargs="*", metavar="MODEL",
        help="model paths or registered names (default: every model of --config)",
    )  # fmt: skip
    retune.add_argument("--config", default="configs/models.yaml", help="the models to retune")
    retune.add_argument(
        "--target", default=None, help="'llvm' (this CPU, default), 'cuda', or a JSON target object"
    )
    retune.add_argument("--trials", type=int, default=128, help="measured trials per model")
    retune.add_argument(
        "--time-budget", type=float, default=None, metavar="SECONDS",
        help="stop tuning each model after this much wall-clock time",
    )  # fmt: skip
    retune.add_argument(
        "--search", default="gradient",
        help="gradient (Felix) | evolutionary | replay-trace | replay-func",
    )  # fmt: skip
    retune.add_argument(
        "--mlflow-uri", default=os.environ.get("MLFLOW_TRACKING_URI"),
        help="the registry holding the champions (default: $MLFLOW_TRACKING_URI)",
    )  # fmt: skip
    retune.add_argument("--out", default="runs/retune", help="output directory of the tunes")
    retune.add_argument(
        "--tracker", default=None, metavar="HOST:PORT",
        help="existing RPC tracker (default: start a local fleet)",
    )  # fmt: skip
    retune.add_argument("--key", default=None, help="device key on the tracker")
    retune.add_argument("--rpc-servers", type=int, default=1, help="servers in the local fleet")
    retune.add_argument("--seed", type=int, default=0)
    retune.add_argument("--measure", default="fixed", choices=MEASURE_MODES)
    retune.add_argument(
        "--dask-address", default=None, metavar="tcp://HOST:PORT",
        help="tune the models concurrently on this Dask cluster (default: a local cluster "
        "with as many workers as can measure without timing each other)",
    )  # fmt: skip
    retune.add_argument(
        "--cold", action="store_true",
        help="tune from nothing (default: warm-start from the registry's tuned schedules)",
    )  # fmt: skip
    retune.add_argument(
        "--dask-workers", type=int, default=None, metavar="N",
        help="workers of the local Dask cluster (default: cores / the target's num-cores)",
    )  # fmt: skip


def cmd_retune(args: argparse.Namespace) -> int:
    """Check everything cheap first (config, models, settings, registry), then run the flow;
    exit 4 when a challenger failed verification (``retune.ChallengerRejected``)."""
    from .frontend import check_model_file
    from .job import make_job
    from .preflight import check_tracking_uri, check_writable
    from .retune import ChallengerRejected, load_config, registered_name, select

    if not args.mlflow_uri:
        raise GradtuneError(
            "retune compares with a registered champion: pass --mlflow-uri or set "
            "MLFLOW_TRACKING_URI"
        )
    specs = select(load_config(args.config), args.models)
    for spec in specs:
        check_model_file(spec.path, spec.input_shapes)
        make_job(
            args.target, model=spec.path, entry=spec.entry, input_shapes=spec.input_shapes,
            trials=args.trials, time_budget=args.time_budget, search=args.search,
            tracker=args.tracker, key=args.key, name=registered_name(spec),
            rpc_servers=args.rpc_servers, seed=args.seed, measure=args.measure,
        )  # fmt: skip
    if args.dask_address:
        from .scaleout import check_address

        try:
            check_address(args.dask_address)
        except ValueError as err:
            raise GradtuneError(str(err)) from None
    if args.dask_workers is not None and args.dask_workers < 1:
        raise GradtuneError(f"--dask-workers must be at least 1 (got {args.dask_workers})")
    check_writable(Path(args.out), "--out")
    check_tracking_uri(args.mlflow_uri)
    if args.tracker:
        from .measure.rpc_fleet import check_tracker, parse_tracker

        check_tracker(parse_tracker(args.tracker, args.key))
    from .frontend import load_model
    from .target import check_device, read_target_spec

    check_device(read_target_spec(args.target))
    for spec in specs:  # a model that fails on its own inputs: one line before Prefect starts
        load_model(spec.path, spec.entry, spec.input_shapes)
    _environment_defaults()
    retune_on_change = load_flow("retune", "retune_on_change")
    _quiet_prefect_user_errors()
    from .target import parse_target

    results = retune_on_change(
        models=[spec.path for spec in specs], config=args.config,
        target=json.dumps(parse_target(args.target)), trials=args.trials,
        time_budget=args.time_budget, search=args.search, mlflow_uri=args.mlflow_uri,
        out=args.out, tracker=args.tracker, key=args.key, rpc_servers=args.rpc_servers,
        seed=args.seed, measure=args.measure, dask_address=args.dask_address,
        dask_workers=args.dask_workers, warm_start=not args.cold,
    )  # fmt: skip
    for r in results:
        detail = r.get("reason") or f"fingerprint {r['fingerprint']} matches the champion"
        print(f"{r['name']}: {r['outcome']} ({detail})")
    print(json.dumps(results))
    rejected = [r["name"] for r in results if r["outcome"] == "rejected"]
    if rejected:
        raise ChallengerRejected(
            f"challenger(s) of {', '.join(rejected)} failed verification: registered under "
            "@challenger with the reason in its tags, not promoted"
        )
    return 0


# --------------------------------------------------------------------------- dataset


def add_dataset_parser(sub) -> None:
    from .dataset.settings import CollectSettings

    d = CollectSettings()
    dataset = sub.add_parser("dataset", help="the TenSet-style dataset: collect, info")
    dataset_sub = dataset.add_subparsers(dest="dataset_command", required=True)
    collect = dataset_sub.add_parser(
        "collect", help="measure the zoo's workloads over RPC into a dataset (resumable)"
    )
    collect.add_argument("--out", default="data", help="dataset directory (default: data)")
    collect.add_argument("--zoo", default="configs/zoo.yaml", help="model zoo config")
    collect.add_argument("--target", default=None, help="llvm (default: this CPU) or JSON")
    collect.add_argument(
        "--max-workloads",
        type=int,
        default=None,
        help="measure only the first N workloads in priority order",
    )
    collect.add_argument(
        "--random", type=int, default=d.random_per_workload, help="random candidates per workload"
    )
    collect.add_argument(
        "--evolutionary",
        type=int,
        default=d.evolutionary_per_workload,
        help="candidates per workload from a short evolutionary search",
    )
    collect.add_argument("--batch-size", type=int, default=d.batch_size)
    collect.add_argument("--builder-workers", type=int, default=d.builder_workers)
    collect.add_argument("--time-budget", type=float, default=None, metavar="SECONDS")
    collect.add_argument(
        "--tracker",
        default=None,
        metavar="HOST:PORT",
        help="existing RPC tracker (default: start a local fleet)",
    )
    collect.add_argument("--key", default=None, help="device key on the tracker")
    collect.add_argument("--seed", type=int, default=d.seed)
    collect.add_argument(
        "--push",
        action="store_true",
        help="after `dvc add` of the finished dataset, `dvc push` it (OUT must be in a DVC repo)",
    )
    collect.add_argument(
        "--remote", default=None, metavar="NAME", help="DVC remote to push to (default: the repo's)"
    )
    info = dataset_sub.add_parser("info", help="counts and latency spread of a dataset")
    info.add_argument("data", help="dataset directory")


def cmd_dataset(args: argparse.Namespace) -> int:
    from .dataset.card import dataset_summary
    from .dataset.settings import CollectSettings

    if args.dataset_command == "info":
        summary = dataset_summary(args.data)
        for name, f in summary["families"].items():
            print(
                f"{name:32s} {f['workloads']:4d} workloads {f['records']:7d} records "
                f"median/best {f['median_over_best']}"
            )
        keys = ("workloads", "workloads_with_records", "workloads_complete", "records", "failed")
        print(json.dumps({k: summary[k] for k in keys}))
        return 0
    from .target import parse_target

    for flag in ("random", "evolutionary", "batch_size", "builder_workers"):
        if getattr(args, flag) < (1 if flag in ("batch_size", "builder_workers") else 0):
            raise GradtuneError(f"--{flag.replace('_', '-')} must be positive")
    if args.max_workloads is not None and args.max_workloads <= 0:
        raise GradtuneError("--max-workloads must be positive")
    if not Path(args.zoo).is_file():
        raise GradtuneError(f"zoo config not found: {args.zoo}")
    from .dataset.versioning import check_versioning

    check_versioning(args.out, args.push, args.remote)
    tracker = None
    if args.tracker:
        from .measure.rpc_fleet import check_tracker, parse_tracker

        tracker = parse_tracker(args.tracker, args.key)
        check_tracker(tracker)
    if os.environ.get(_RELAYED_BY) != str(os.getppid()):  # see _relay_signals
        return _relay_signals(_start_in_own_session(_collect_argv(args)))[0]
    settings = CollectSettings(
        random_per_workload=args.random,
        evolutionary_per_workload=args.evolutionary,
        batch_size=args.batch_size,
        builder_workers=args.builder_workers,
        seed=args.seed,
    )
    _environment_defaults()
    collect_dataset = load_flow("collect_dataset")
    _quiet_prefect_user_errors()
    resume = "rerun the same command to resume (measured records are kept)"
    try:
        summary = collect_dataset(
            args.out,
            args.zoo,
            json.dumps(parse_target(args.target)),
            settings,
            max_workloads=args.max_workloads,
            time_budget=args.time_budget,
            tracker=tracker,
            push=args.push,
            remote=args.remote,
        )
    except KeyboardInterrupt:  # a second signal, or one before the collection started
        print(f"gradtune: interrupted; {resume}", file=sys.stderr)
        return 130
    keys = ("workloads", "workloads_with_records", "workloads_complete", "records", "failed")
    print(json.dumps({k: summary[k] for k in keys}))
    if summary["dvc_file"]:
        print(f"versioned: {summary['dvc_file']} (commit it to git)", file=sys.stderr)
    if summary["stopped"]:
        print(f"gradtune: collection stopped; {resume}", file=sys.stderr)
        return 130
    return 0


# Set in the environment of a command's own process to the pid of the one relaying to it.
_RELAYED_BY = "GRADTUNE_RELAYED_BY"
# The tracking URI reaches that process in its environment, not on its command line, which
# every user of the machine can read (ps, /proc/PID/cmdline): it may carry a password.
_RELAYED_MLFLOW_URI = "GRADTUNE_RELAYED_MLFLOW_URI"


def _start_in_own_session(
    module_argv: list[str], env: dict[str, str] | None = None, held: bool = False
) -> subprocess.Popen:
    """``python -m MODULE ARG ...`` started as the leader of a new session, dying with this
    process (``gradtune.lifeline``); ``env`` is added to its environment. ``held``: its stdin
    is a pipe from this process (a held tuning process waits on it for ``_GO``)."""
    environment = {**os.environ, **(env or {}), _RELAYED_BY: str(os.getpid())}
    argv = [sys.executable, "-m", "gradtune.lifeline", str(os.getpid()), *module_argv]
    stdin = subprocess.PIPE if held else None
    return subprocess.Popen(argv, env=environment, start_new_session=True, stdin=stdin)


def _relay_signals(
    child: subprocess.Popen, kill_after: float | None = None
) -> tuple[int, int | None]:
    """Wait for ``child``, the leader of a session of its own (``_start_in_own_session``),
    relaying SIGINT and SIGTERM to it; returns its exit code and the first signal relayed
    (None if none).

    A terminal's Ctrl-C signals its whole foreground process group (so does ``kill -- -PGID``):
    Prefect's temporary API server and TVM's build and run workers would die with the batch in
    flight, and the flow with them. In a session of its own, the command hears only the
    signals relayed here, each of which stops it cleanly. A signal before this is called stops
    this process as usual, and the child with it: it dies with this process
    (``gradtune.lifeline``), a kill -9 of it included, and takes its process group along.

    With ``kill_after``, the group is also SIGKILLed that many seconds after the first signal
    if the child still runs (a second signal: at once), for the child may be blocked where no
    signal reaches. What is left of the group once the child has exited is killed in any case:
    those are its helpers.
    """
    import signal
    import time

    relayed: list[int] = []
    deadline = [None]  # monotonic time at which to kill the child's group

    def relay(signum: int, frame: object) -> None:
        if kill_after is not None:
            deadline[0] = time.monotonic() + (kill_after if not relayed else 0.0)
        relayed.append(signum)
        child.send_signal(signum)

    handled = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, relay) for sig in handled}
    try:
        while True:
            # Polled, not waited: a signal handled during a blocking wait would resume it,
            # leaving the deadline unwatched.
            try:
                code = child.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                if deadline[0] is not None and time.monotonic() >= deadline[0]:
                    _kill_group(child.pid)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _kill_group(child.pid)
    code = code if code >= 0 else 128 - code  # killed by a signal: the shell's convention
    return code, (relayed[0] if relayed else None)


def _kill_group(pgid: int) -> None:
    import signal

    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _collect_argv(args: argparse.Namespace) -> list[str]:
    """The ``dataset collect`` command line of ``args`` (each option's dest is its flag)."""
    argv = ["gradtune.cli"]
    argv += ["--debug"] if args.debug else []  # a top-level flag: before the subcommand
    argv += ["dataset", "collect"]
    for dest, value in vars(args).items():
        if dest in ("command", "dataset_command", "debug") or value is None or value is False:
            continue
        argv += [f"--{dest.replace('_', '-')}"] + ([] if value is True else [str(value)])
    return argv


# Flags that are on unless negated (``--no-...``): relayed as the negation when off.
_ON_BY_DEFAULT = ("fast_math",)


def _tune_argv(args: argparse.Namespace) -> list[str]:
    """The ``tune`` (or ``transfer``) command line of ``args`` (each option's dest is its
    flag), but for ``--mlflow-uri`` (``_RELAYED_MLFLOW_URI``)."""
    argv = ["gradtune.cli"]
    argv += ["--debug"] if args.debug else []  # a top-level flag: before the subcommand
    argv += [args.command]
    for dest, value in vars(args).items():
        flag = f"--{dest.replace('_', '-')}"
        if value is False and dest in _ON_BY_DEFAULT:
            argv.append(f"--no-{dest.replace('_', '-')}")
            continue
        if dest in ("command", "model", "debug", "mlflow_uri") or value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        else:
            for item in value if isinstance(value, list) else [value]:
                argv += [flag, str(item)]
    return [*argv, "--", args.model]


def cmd_tune(args: argparse.Namespace) -> int:
    from .frontend import parse_input_shapes
    from .preflight import checked_job

    transfer = args.command == "transfer"
    settings = dict(
        model=args.model,
        entry=args.entry,
        input_shapes=parse_input_shapes(args.input_shape),
        trials=128 if transfer else args.trials,
        time_budget=None if transfer else args.time_budget,
        out=args.out or str(Path("runs") / Path(args.model).stem),
        resume=args.resume,
        search="gradient" if transfer else args.search,
        tracker=args.tracker,
        key=args.key,
        mlflow_uri=args.mlflow_uri,
        name=args.name,
        alias=args.alias,
        rpc_servers=args.rpc_servers,
        seed=args.seed,
        measure=args.measure,
        confirm=args.confirm,
        warmup=None if transfer else args.warmup,
        library=args.library if transfer else args.warm_start,
        library_from=getattr(args, "from"),
        transfer_only=transfer,
        fast_math=args.fast_math,
        weight_prepack=args.weight_prepack,
        conv_layout=args.conv_layout,
        fold_batchnorm=args.fold_batchnorm,
        subpixel_conv_transpose=args.subpixel_conv_transpose,
    )
    if os.environ.get(_RELAYED_BY) == str(os.getppid()):
        # The process _supervise_tune watches: its parent checks everything (checked_job).
        settings["mlflow_uri"] = os.environ.get(_RELAYED_MLFLOW_URI)
        return _tune_when_told(args.target, settings)
    secret = {_RELAYED_MLFLOW_URI: args.mlflow_uri} if args.mlflow_uri else {}
    # The tuning process starts at once, importing what it needs while this one checks the job
    # (~10 s each on 2 cores, no longer one after the other); it tunes only once told to.
    held = _start_in_own_session(_tune_argv(args), secret, held=True)
    try:
        checked_job(args.target, **settings)
    except BaseException:
        _kill_group(held.pid)
        held.wait()
        raise
    with contextlib.suppress(BrokenPipeError):  # it died warming up: its exit code says how
        held.stdin.write(_GO)
        held.stdin.close()
    return _supervise_tune(held)


# What a held tuning process waits for on its stdin: the job passed its checks.
_GO = b"go\n"


def _tune_when_told(target: str | None, settings: dict) -> int:
    """The tuning process of ``cmd_tune``: warm up while its parent checks the job, then tune
    once told to. Until then it says nothing: the parent reports bad input, in one line."""
    _environment_defaults()  # before Prefect reads its settings
    # What fails here fails again once told, where it is reported (or the parent refuses it).
    with contextlib.suppress(Exception):
        load_flow("tune_model")  # Prefect, MLflow, PyTorch, TVM: the seconds worth overlapping
        from .frontend import load_model

        # The import stage then reuses it. ONNX Runtime writes a model's errors to the
        # process's stderr itself, past Python.
        with _stderr_to_devnull():
            load_model(settings["model"], settings["entry"], settings["input_shapes"])
    if sys.stdin.buffer.readline() != _GO:
        return 1  # refused (the parent said why and stops this process) or the parent died
    from .job import make_job

    return _tune_here(make_job(target, **settings))


@contextlib.contextmanager
def _stderr_to_devnull():
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


# The tuning flow stops itself within stop.GRACE_SECONDS of a signal; this is the backstop.
_TUNE_KILL_AFTER = 7.0


def _supervise_tune(child: subprocess.Popen) -> int:
    """Wait for the tuning process, in a session of its own (``_relay_signals``), so that
    however it is blocked, a signal ends it within ``_TUNE_KILL_AFTER`` seconds; say how it
    ended if not on its own."""
    import signal

    code, signum = _relay_signals(child, _TUNE_KILL_AFTER)
    # Checking the job (the model's import) may have left worker processes of this one;
    # they would outlive an os._exit.
    import psutil

    for helper in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            helper.kill()
    resume = "rerun the same command with --resume to continue (measured records are kept)"
    if signum is not None:
        print(f"gradtune: stopped by {signal.Signals(signum).name}; {resume}", file=sys.stderr)
        # Now, as a signal ends a process: tearing down an interpreter that has imported
        # PyTorch and MLflow (to check the job) takes seconds on a loaded machine.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(128 + signum)
    if code > 128 and code - 128 in {s.value for s in signal.Signals}:
        name = signal.Signals(code - 128).name
        print(f"gradtune: the tuning process was killed ({name}); {resume}", file=sys.stderr)
    return code


def _tune_here(job: TuneJob) -> int:
    """The tuning flow, in the process ``_supervise_tune`` started."""
    try:
        _environment_defaults()
        tune_model = load_flow("tune_model")
        _quiet_prefect_user_errors()
        from .pipeline import print_summary

        summary = tune_model(**job.flow_parameters())
    except KeyboardInterrupt:
        return 130  # the process that relayed the signal says so
    print_summary(summary)
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    from .preflight import check_tracking_uri, check_writable

    check_writable(Path(args.out), "--out")
    if args.mlflow_uri:  # checked before MLflow's import, which alone takes seconds
        check_tracking_uri(args.mlflow_uri, existing=True)
    from .registry import pull

    info = pull(args.ref, Path(args.out), args.mlflow_uri, args.allow_unverified)
    print(json.dumps(info, indent=2))
    if not info["finite"]:
        raise GradtuneError(f"{args.ref} produced non-finite outputs")
    return 0


def cmd_symbolic(args: argparse.Namespace) -> int:
    from .symbolic.verify import run

    return run(args.path, args.target, args.samples, args.seed)


def cmd_costmodel(args: argparse.Namespace) -> int:
    from rich.console import Console

    if args.costmodel_command == "pretrain":
        return cmd_pretrain(args)
    from .costmodel.evaluate import evaluate, print_table, write_report
    from .target import make_target, parse_target

    console = Console(stderr=True)
    target = make_target(parse_target(args.target))
    losses = ("rank", "mse") if args.loss == "both" else (args.loss,)
    result = evaluate(args.dataset, args.split, target, args.epochs, console, losses)
    print_table(result, console)
    if args.out:
        console.print(f"wrote {write_report(result, args.out)}")
    keys = ("split", "ours", "xgb", "ms_mlp")
    print(json.dumps({k: result[k] for k in keys}))
    return 0


def cmd_pretrain(args: argparse.Namespace) -> int:
    if args.epochs <= 0:
        raise GradtuneError("--epochs must be positive")
    if not args.reuse_features:
        from .dataset.card import load_manifest
        from .dataset.store import open_dataset

        if not Path(args.dataset).is_dir():
            raise GradtuneError(f"dataset directory not found: {args.dataset}")
        # Bad or empty data is a one-line error before Prefect starts; the cleaned copy is
        # cached by content, so the flow's own load is then cheap.
        open_dataset(args.dataset, target=load_manifest(Path(args.dataset)).get("target"))
    if args.mlflow_uri:
        from .preflight import check_tracking_uri

        check_tracking_uri(args.mlflow_uri)
    _environment_defaults()
    pretrain_cost_model = load_flow("pretrain_cost_model")
    _quiet_prefect_user_errors()
    summary = pretrain_cost_model(
        data=args.dataset,
        features=args.features,
        weights=args.weights,
        loss=args.loss,
        epochs=args.epochs,
        tracking_uri=args.mlflow_uri,
        reuse_features=args.reuse_features,
    )
    print(json.dumps(summary))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    try:
        commands = {
            "tune": cmd_tune,
            "transfer": cmd_tune,
            "library": cmd_library,
            "pull": cmd_pull,
            "symbolic": cmd_symbolic,
            "costmodel": cmd_costmodel,
            "dataset": cmd_dataset,
            "register": cmd_register,
            "retune": cmd_retune,
        }
        return commands[args.command](args)
    except GradtuneError as err:
        if args.debug:
            err.__suppress_context__ = False  # the error it was raised from is the useful part
            traceback.print_exception(err)
        print(f"gradtune: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("gradtune: interrupted; rerun the same command with --resume to continue",
              file=sys.stderr)  # fmt: skip
        return 130


if __name__ == "__main__":
    sys.exit(main())
