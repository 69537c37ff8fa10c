"""A fresh gradient search on one task, round by round, for the benchmarks that time its
descent (``descent_threads.py``, ``descent_speed.py``).

The search runs at today's defaults but without the explorer (its evolution is TVM's, on
TVM's threads) and with one seed for every trial. Each round: the batch chosen (its
``descent_s`` from the search's own account), then synthetic results to learn from
(``notify_runner_results``: the fine-tune, timed), fixed by position so that every trial
learns the same thing.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MODEL_FILES = {
    "small_cnn": ROOT / "examples" / "small_cnn.py",
    "mbconv_se": ROOT / "bench" / "models" / "mbconv_se.py",
    "unet_small": ROOT / "bench" / "models" / "unet_small.py",
}
BATCH = 25  # the CLI's batch at the search benchmark's budgets


def add_trial_args(parser: Any, repeats: int, per: str) -> None:
    """``--repeats`` and ``--models``, as both descent benchmarks take them."""
    parser.add_argument("--repeats", type=int, default=repeats, help=f"trials per {per} (≥ 3)")
    parser.add_argument("--models", nargs="+", default=["small_cnn", "mbconv_se"],
                        metavar="MODEL", help=f"of {', '.join(MODEL_FILES)}")  # fmt: skip


def check_trial_args(parser: Any, args: Any, name: str) -> None:
    """One line and exit 2 for an unknown model or fewer than 3 repeats."""
    unknown = [m for m in args.models if m not in MODEL_FILES]
    if unknown:
        parser.exit(2, f"{name}: unknown model {', '.join(unknown)} "
                       f"(choose from {', '.join(MODEL_FILES)})\n")  # fmt: skip
    if args.repeats < 3:
        parser.exit(2, f"{name}: --repeats must be at least 3\n")


def largest_task(model: str, target: Any) -> Any:
    """The model's task with the most FLOPs."""
    from gradtune.frontend import load_model
    from gradtune.partition import partition

    imported = load_model(MODEL_FILES[model])
    _, tasks = partition(imported.mod, imported.params, target)
    return max(tasks, key=lambda t: t.flops)


def descent_rounds(task: Any, target: Any, rounds: int) -> list[dict[str, Any]]:
    """``rounds`` rounds of a fresh search on ``task``: per round its picks (the decisions,
    in order), ``descent_s`` and ``finetune_s``."""
    from tvm.s_tir import meta_schedule as ms

    from gradtune.search import make_strategy
    from gradtune.search.gradient_search import GradientConfig
    from gradtune.search.session import Session

    search = make_strategy("gradient", config=GradientConfig(evolutionary_explore=False))
    session = Session()
    search.attach(session)
    context = ms.TuneContext(
        mod=task.mod, target=target, space_generator="post-order-apply",
        search_strategy="replay-trace", task_name=task.name, num_threads=2, rand_state=1,
    ).clone()  # fmt: skip
    search._initialize_with_tune_context(context)
    search.pre_tuning(rounds * BATCH, BATCH, context.generate_design_space(),
                      ms.database.MemoryDatabase(), ms.cost_model.XGBModel())  # fmt: skip
    out = []
    for r in range(rounds):
        candidates = search.generate_measure_candidates()
        results = [
            ms.runner.RunnerResult(run_secs=[1e-4 * (1 + (7 * i + r) % 25)], error_msg=None)
            for i in range(len(candidates))
        ]
        start = time.perf_counter()
        search.notify_runner_results(candidates, results)
        out.append({
            "picks": [str(c.sch.trace.decisions) for c in candidates],
            "descent_s": session.take(task.name).descent_s,
            "finetune_s": time.perf_counter() - start,
        })  # fmt: skip
    return out
