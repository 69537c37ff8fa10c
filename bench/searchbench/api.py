"""Every call the benchmark makes into gradtune, in one module.

gradtune's modules are being reorganised; keeping the benchmark's entry points here means a
rename touches one file. Each function does what the ``gradtune tune`` CLI does at that step,
so the benchmark tunes exactly as a user would: the same importers, partition, builder, local
RPC fleet, task scheduler and batch size.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# What ``gradtune tune --time-budget B --trials 5000`` passes: the budget ends the run, the
# trial count only sizes the default batch (``default_trials_per_round``).
CLI_TRIALS = 5000


def host_target() -> tuple[dict[str, Any], Any]:
    """(config, tvm Target) of ``--target llvm``: this CPU with its mcpu and core count."""
    from gradtune.target import make_target, parse_target

    config = parse_target("llvm")
    return config, make_target(config)


def use_target_threads(config: dict[str, Any]) -> int:
    """TVM's runtime threads for ``config``'s kernels, set as ``gradtune tune`` sets them."""
    from gradtune.threads import use_target_threads as use

    return use(config)


def import_model(path: Path) -> Any:
    """``gradtune.frontend.ImportedModel`` of a .py (``get_model``) or .onnx file."""
    from gradtune.frontend import load_model

    return load_model(path)


def partition_model(model: Any, target: Any) -> tuple[Any, list[Any]]:
    """(fused module, tuning tasks with their untuned latencies measured)."""
    from gradtune.partition import partition

    return partition(model.mod, model.params, target)


def random_schedules(
    paths: list[Path], tasks_per_model: int, count: int, seed: int, target: Any, cores: int
) -> Iterator[tuple[str, str, list[Any]]]:
    """Per model file, its ``tasks_per_model`` costliest tasks (untuned latency × calls), each
    with ``count`` random schedules of its design space (MetaSchedule's replay-trace
    sampling): (model stem, task name, MeasureCandidates)."""
    import math

    from tvm.s_tir import meta_schedule as ms

    from gradtune.tvm_compat import register_tensor_intrinsics

    register_tensor_intrinsics(target.kind.name)
    for path in paths:
        model = import_model(path)
        _, tasks = partition_model(model, target)
        tasks.sort(key=lambda t: -t.untuned_total_us if math.isfinite(t.untuned_us) else 0)
        for index, task in enumerate(tasks[:tasks_per_model]):
            context = ms.TuneContext(
                mod=task.mod, target=target, space_generator="post-order-apply",
                search_strategy="replay-trace", task_name=task.name, num_threads=cores,
                rand_state=seed + index,
            )  # fmt: skip
            context.pre_tuning(
                max_trials=count, num_trials_per_iter=count,
                design_spaces=context.generate_design_space(),
            )  # fmt: skip
            yield Path(path).stem, task.name, list(context.generate_measure_candidates() or [])


def default_lowering(exact: bool = False) -> dict[str, bool]:
    """The lowering ``partition_model`` (like the CLI) tunes in, as ``Lowering``'s fields;
    ``exact``: the one before fast math was the default (libm's functions)."""
    from dataclasses import asdict

    from gradtune.partition import DEFAULT_LOWERING, EXACT_LOWERING

    return asdict(EXACT_LOWERING if exact else DEFAULT_LOWERING)


def recorded_lowering(record: dict[str, Any] | None) -> dict[str, Any]:
    """Every ``Lowering`` field of a recorded lowering, those it lacks as they were then."""
    from gradtune.partition import recorded_lowering as complete

    return complete(record)


def workload_key(task: Any) -> str:
    """A task's structural hash as the dataset and the JSONDatabase key workloads."""
    import tvm_ffi

    return str(tvm_ffi.structural_hash(task.mod))


def default_trials_per_round(num_tasks: int) -> int:
    from gradtune.tune import default_trials_per_round as cli_default

    return cli_default(CLI_TRIALS, num_tasks)


def manifest_workloads(data_dir: Path) -> dict[str, Any]:
    """The dataset manifest's ``workloads``: key → {"models": [...], ...}."""
    from gradtune.dataset.card import load_manifest

    return load_manifest(data_dir)["workloads"]


def training_groups(features: Path, machines: str) -> list[Any]:
    """The ``pretrain`` stage's training groups (``Group.name`` is the workload key), of the
    records of the machines ``machines`` selects (params.yaml's ``pretrain.machines``)."""
    from gradtune.costmodel.pretrain import load_groups

    groups, _meta = load_groups(features, machines)
    return groups


def pretrain_leaving_out(
    groups: list[Any], excluded: set[str], params: dict[str, Any], weights: Path
) -> dict[str, Any]:
    """Pretrain with ``params`` (params.yaml's ``pretrain``) minus ``excluded``; save weights."""
    from gradtune.costmodel import leave_out
    from gradtune.costmodel.pretrain import write_weights

    model, info = leave_out.pretrain_leaving_out(
        groups, excluded, params["loss"], int(params["epochs"]), float(params["lr"]),
        int(params["seed"]),
    )  # fmt: skip
    write_weights(model, weights)
    return info


def pretrain_ensemble_leaving_out(
    groups: list[Any], excluded: set[str], params: dict[str, Any], first: Path, path: Path,
    members: int,
) -> dict[str, Any]:  # fmt: skip
    """A deep ensemble of ``members``: the leave-out model at ``first`` (seed ``params.seed``)
    and ``members - 1`` more trained on the same groups with the next seeds; saved to ``path``."""
    from gradtune.costmodel import ensemble
    from gradtune.costmodel.model import load

    kept = [g for g in groups if g.name not in excluded]
    others, losses = ensemble.pretrain_members(
        kept, members - 1, params["loss"], int(params["epochs"]), float(params["lr"]),
        int(params["seed"]) + 1,
    )  # fmt: skip
    ensemble.save_members([load(first), *others], path)
    return {"members": members, "final_losses_of_added": [round(x, 5) for x in losses]}


def make_searcher(
    name: str, target_kind: str, weights: Path | None, gradient: dict[str, Any] | None = None
) -> Any:
    """The strategy ``--search NAME`` gives, the gradient search's cost model loaded from
    ``weights`` (the leave-this-model-out copy, a deep ensemble's when the configuration
    needs one) and its ``GradientConfig`` from ``gradient`` (an ablation; None for the
    defaults)."""
    from gradtune.search import make_strategy

    if name == "gradient":
        from gradtune.costmodel.online import OnlineCostModel
        from gradtune.search.gradient_search import GradientConfig

        config = GradientConfig(**(gradient or {}))
        if config.needs_ensemble:
            cost_model = OnlineCostModel.ensemble(target_kind, path=weights)
        else:
            cost_model = OnlineCostModel.default(target_kind, path=weights)
        return make_strategy("gradient", target_kind, cost_model=cost_model, config=config)
    return make_strategy(name, target_kind)


def scheduler_cost_model(name: str, target_kind: str, ensemble: Path | None) -> Any:
    """The task scheduler's cost model: ``xgb`` (MetaSchedule's, what the CLI runs) or
    ``ensemble``, the leave-out deep ensemble at ``ensemble`` as a ``PyCostModel`` (a fresh
    object, apart from any the gradient search holds)."""
    if name == "xgb":
        return "xgb"
    if name == "ensemble" and ensemble is not None:
        from gradtune.costmodel.online import OnlineCostModel

        return OnlineCostModel.ensemble(target_kind, path=ensemble)
    raise ValueError(f"no scheduler cost model {name!r} (with ensemble {ensemble})")


@contextmanager
def local_fleet() -> Iterator[Any]:
    """The CLI's default device: a local RPC tracker with one server, stopped on exit."""
    from gradtune.measure.rpc_fleet import LocalFleet

    with LocalFleet() as tracker:
        yield tracker


def tune(
    tasks: list[Any],
    target: Any,
    work_dir: Path,
    tracker: Any,
    budget: float,
    strategy: Any,
    seed: int,
    trials_per_round: int | None,
    on_round: Callable[[Any], None],
    warm_start: Callable[[Any, Any, Any, int], int] | None = None,
    measure: str = "fixed",
    cost_model: Any = "xgb",
    warmup: str | None = None,
) -> Any:
    """``gradtune tune --time-budget BUDGET --trials 5000 --seed SEED --measure MEASURE
    --warmup WARMUP`` on ``tasks``; ``warm_start`` is what ``--warm-start`` adds (``strategy``
    None: ``gradtune transfer``); ``cost_model`` the task scheduler's
    (``scheduler_cost_model``)."""
    from gradtune.measure.runner import MeasureSettings
    from gradtune.tune import tune as gradtune_tune

    return gradtune_tune(
        tasks, target, work_dir, tracker, max_trials=CLI_TRIALS, time_budget=budget,
        search=strategy, trials_per_round=trials_per_round, seed=seed, on_round=on_round,
        warm_start=warm_start, measure=MeasureSettings(mode=measure), cost_model=cost_model,
        warmup=warmup,
    )  # fmt: skip


def stop_at(strategy: Any, seconds: float) -> threading.Timer:
    """Set the run's stop signal after ``seconds`` (started here; cancel it when tuning ends).

    ``tune`` keeps its time budget when it picks a task and when a batch is joined; a
    generation under way (MetaSchedule's evolution, tens of seconds on a large task) learns of
    the budget only from this signal. ``tune`` attaches its ``Session`` to the strategy before
    tuning starts, so the timer looks the session up when it fires."""
    timer = threading.Timer(seconds, lambda: strategy.session.stop.set())
    timer.daemon = True
    timer.start()
    return timer


def search_summary(result: Any) -> dict[str, Any]:
    """The gradient search's totals (fallback tasks, NaN seeds, cost model) from a result."""
    from dataclasses import asdict

    return asdict(result.search_summary) if result.search_summary is not None else {}


def open_database(path: Path) -> Any:
    from gradtune.tune import run_database

    return run_database(path)


def build_verify_export(model: Any, fused: Any, target: Any, database: Any, out: Path) -> float:
    """Compile with the schedules in ``database`` (``open_database``, or a run's confirmed
    winners), check the outputs against the source framework's, write the shared library;
    returns the max abs error."""
    from gradtune import compilation

    executable = compilation.build(fused, target, database)
    runner = compilation.Runner(executable, target, model.inputs)
    error = compilation.verify(runner.outputs(), model.reference_outputs, str(out.name))
    compilation.export(executable, out)
    return error


def time_libraries(
    libraries: dict[str, Path], inputs: list[Any], target: Any,
    extra: dict[str, Callable[[], Any]] | None = None,
) -> Any:  # fmt: skip
    """Each exported library (and each ``extra`` call: a peer) timed interleaved in this
    process: a ``compilation.Timing`` (``medians()``: ms per inference over its rounds of one
    cross-core state)."""
    import tvm

    from gradtune import compilation

    calls = dict(extra or {})
    for label, path in libraries.items():
        vm, dev = compilation.load_exported(path, target)
        args = [tvm.runtime.tensor(x, dev) for x in inputs]

        def run(main: Any = vm["main"], dev: Any = dev, args: list[Any] = args) -> None:
            main(*args)  # looked up once, as compilation.Runner does
            dev.sync()

        calls[label] = run
    # More and longer repeats than the CLI's timing: up to 18 libraries share a shared machine.
    return compilation.time_rounds(calls, repeats=15, min_seconds=0.1)
