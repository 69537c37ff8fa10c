"""The quiet confirmation of each task's few best (``gradtune.measure.confirm``), weighed on
the search benchmark's finished runs: search for (1 - share) of the budget and confirm, or
search for all of it and ship the recorded best.

A run of ``bench/search_efficiency.py`` keeps its database in measurement order with every
batch's wall-clock time, so the database as it stood at (1 - share) · B is its first N
records. For each finished run (both searchers, every repeat) this

1. cuts the run's database to the records measured by (1 - share) · B;
2. confirms it as ``gradtune tune`` does after its search (the same builder, a local RPC fleet
   with one server, the CLI's evaluator, ``--confirm K``, the share of the budget as its
   deadline), with nothing else running;
3. compiles the confirmed winners, checks the outputs against the source framework and
   exports the library;

then times, per model, every run's confirmed library and its library as tuned by all of B
(the search benchmark's ``model_at_100``) interleaved in one process. Both contenders spend
the same budget: the confirmed one's search stopped earlier by the time its confirmation took
(reported; it must fit the share).

    .venv/bin/python bench/confirm_replay.py --work bench/work/emr --budget 480 \\
        --models squeeze_fire mbconv_se [--gradient-config ...] [--share 0.1] [--top-k 4]

Resumable: a run already confirmed (its ``confirm_replay.json``) is kept, and the timing is
redone only when a library changed. Writes ``--out``/confirm_replay[_<config>].{md,json}; the
last line printed is the JSON summary ``{"models": {name: {searcher: {"ratio_median",
"ratios", "confirm_s_max", "changed_tasks"}}}, "share", "top_k", "commit"}`` where a ratio is
the plain library's ms over the confirmed one's (above 1: confirming is faster).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from searchbench import api
from searchbench.analysis import paired_ratio
from searchbench.layout import Layout, add_work_and_out, resolve_out, write_json
from searchbench.models import MODELS, ROOT
from searchbench.report import git_commit, machine
from searchbench.run import records_by, truncated_database
from searchbench.timing import PASSES, identities, timed

DEFAULT_WORK = ROOT / "bench" / "work"
STEM = "confirm_replay"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=480.0, help="the runs' budget (s)")
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), required=True)
    parser.add_argument("--gradient-config", default="",
                        help="the layout of the gradient runs (search_efficiency's)")  # fmt: skip
    parser.add_argument("--share", type=float, default=0.1,
                        help="the budget's share left to the confirmation")  # fmt: skip
    parser.add_argument("--top-k", type=int, default=4, help="programs per task (--confirm K)")
    add_work_and_out(parser, DEFAULT_WORK)
    args = parser.parse_args(argv)
    if not 0 < args.share < 1 or args.top_k < 1:
        parser.error("--share must lie in (0, 1) and --top-k be at least 1")
    resolve_out(args, DEFAULT_WORK)
    return args


def replay_dir(run_dir: Path, share: float, top_k: int) -> Path:
    return run_dir / f"confirm_{round(100 * (1 - share))}_k{top_k}"


def replay_run(layout: Layout, result: dict[str, Any], share: float, top_k: int) -> dict:
    """Cut, confirm, compile and export one run; its record (kept in the replay's folder)."""
    from gradtune.measure.builder import make_builder
    from gradtune.measure.confirm import confirm
    from gradtune.measure.runner import MeasureSettings, make_rpc_runner
    from gradtune.tune import compile_database, run_database

    run_dir = layout.root / "runs" / result["model"] / result["run_id"]
    folder = replay_dir(run_dir, share, top_k)
    done = folder / "confirm_replay.json"
    if done.is_file():
        return with_recorded(layout, result, json.loads(done.read_text()), folder)
    search_s = (1 - share) * layout.budget
    records = records_by(result["rounds"], search_s)
    truncated_database(run_dir, records, folder.name)
    config, target = api.host_target()
    imported = api.import_model(MODELS[result["model"]].tuning_file(layout.work))
    fused, tasks = api.partition_model(imported, target)
    cores = int(config.get("num-cores") or 1)
    with api.local_fleet() as tracker:
        builder = make_builder(max_workers=cores)
        runner = make_rpc_runner(tracker, MeasureSettings())
        try:
            start = time.perf_counter()
            # As in tune: the confirmation has the budget's share the search left it.
            confirmation = confirm(
                tasks, target, run_database(folder), builder, runner, folder, top_k=top_k,
                deadline=start + share * layout.budget,
            )  # fmt: skip
            seconds = time.perf_counter() - start
        finally:
            runner.pool.shutdown()
            builder.shutdown()
    library = run_dir / f"{folder.name}.so"
    error = api.build_verify_export(imported, fused, target, compile_database(folder), library)
    record = {
        "run_id": result["run_id"],
        "searcher": result["searcher"],
        "records": records,
        "search_s": round(search_s, 1),
        "confirm_s": round(seconds, 2),
        "confirm_share_s": round(share * layout.budget, 1),
        "tasks_confirmed": len(confirmation.tasks),
        "tasks_cut": confirmation.unconfirmed,
        "changed_tasks": confirmation.changed,
        "max_abs_err": error,
        "library": library.name,
        "commit": git_commit(),
    }
    record = with_recorded(layout, result, record, folder)
    print(f"{result['model']} {result['run_id']}: {records} records by {search_s:.0f} s, "
          f"confirmed in {seconds:.1f} s, {confirmation.changed} of "
          f"{len(confirmation.tasks)} tasks changed", flush=True)  # fmt: skip
    return record


def with_recorded(layout: Layout, result: dict[str, Any], record: dict, folder: Path) -> dict:
    """The replay's record with a third library: the database cut at the same time, compiled
    with its recorded bests (no confirmation). Against it the confirmation's own effect shows;
    against the library at B, what the search would have found in the share it gave up."""
    run_dir = layout.root / "runs" / result["model"] / result["run_id"]
    library = run_dir / f"{folder.name}_recorded.so"
    if record.get("library_recorded") != library.name or not library.is_file():
        _config, target = api.host_target()
        imported = api.import_model(MODELS[result["model"]].tuning_file(layout.work))
        fused, _ = api.partition_model(imported, target)
        api.build_verify_export(imported, fused, target, api.open_database(folder), library)
        record = {**record, "library_recorded": library.name}
    write_json(folder / "confirm_replay.json", record)
    return record


def time_model(layout: Layout, model: str, replays: list[dict], share: float, top_k: int) -> dict:
    """Every run's plain and confirmed library, interleaved in one process (redone only when
    a library changed)."""
    found = {}
    for replay in replays:
        run_dir = layout.root / "runs" / model / replay["run_id"]
        found[f"{replay['run_id']}@100"] = run_dir / "model_at_100.so"
        found[f"{replay['run_id']}@confirmed"] = run_dir / replay["library"]
        found[f"{replay['run_id']}@recorded"] = run_dir / replay["library_recorded"]
    path = layout.root / "timing" / f"{model}_{replay_dir(Path(), share, top_k).name}.json"
    if path.is_file():
        saved = json.loads(path.read_text())
        if saved.get("libraries") == identities(found) and len(saved["passes"]) == PASSES:
            return saved
    # Every ratio below is taken within a pass and its median over the passes reported
    # (searchbench.timing: one library moved by up to 30% between passes of one process).
    record = timed(model, found, layout.work, passes=PASSES)
    write_json(path, record)
    return record


def summarize(model: str, replays: list[dict], timing: dict) -> dict[str, Any]:
    ms, passes = timing["ms"], timing["passes"]

    def paired(a: str, b: str) -> float:
        """Median over the passes of library a's ms over library b's, each within one pass."""
        return paired_ratio(passes, [a], [b])

    out: dict[str, Any] = {}
    for searcher in ("gradient", "evolutionary"):
        mine = [r for r in replays if r["searcher"] == searcher]
        if not mine:
            continue
        plain = [ms[f"{r['run_id']}@100"] for r in mine]
        confirmed = [ms[f"{r['run_id']}@confirmed"] for r in mine]
        recorded = [ms[f"{r['run_id']}@recorded"] for r in mine]
        ratios = [paired(f"{r['run_id']}@100", f"{r['run_id']}@confirmed") for r in mine]
        own = [paired(f"{r['run_id']}@recorded", f"{r['run_id']}@confirmed") for r in mine]
        out[searcher] = {
            "runs": len(mine),
            "ms_plain_median": round(statistics.median(plain), 5),
            "ms_confirmed_median": round(statistics.median(confirmed), 5),
            "ratios": [round(x, 4) for x in ratios],
            "ratio_median": round(statistics.median(ratios), 4),
            "ms_recorded_median": round(statistics.median(recorded), 5),
            # The same cut, recorded bests over confirmed winners: the confirmation alone.
            "confirm_only_ratios": [round(x, 4) for x in own],
            "confirm_only_ratio_median": round(statistics.median(own), 4),
            "confirm_s_max": max(r["confirm_s"] for r in mine),
            "changed_tasks": [r["changed_tasks"] for r in mine],
            "tasks_confirmed": [r["tasks_confirmed"] for r in mine],
        }
    grad, evo = out.get("gradient"), out.get("evolutionary")
    if grad and evo:  # the search benchmark's end-to-end ratio, without and with confirming
        out["e2e_evo_over_grad_plain"] = round(evo["ms_plain_median"] / grad["ms_plain_median"], 4)
        out["e2e_evo_over_grad_confirmed"] = round(
            evo["ms_confirmed_median"] / grad["ms_confirmed_median"], 4
        )
        # Each searcher as `gradtune tune` runs it by default: the gradient search confirms,
        # MetaSchedule's evolutionary search ships its recorded best at B.
        out["e2e_evo_plain_over_grad_confirmed"] = round(
            evo["ms_plain_median"] / grad["ms_confirmed_median"], 4
        )
    return out


def render(args: argparse.Namespace, models: dict[str, Any], commits: set[str]) -> str:
    config, _ = api.host_target()
    host = machine(config)
    lines = [
        f"# Confirming each task's {args.top_k} best quietly, replayed on finished runs",
        "",
        f"Runs: `{args.work}` at {args.budget:g} s"
        + (f", gradient config `{args.gradient_config}`" if args.gradient_config else "")
        + f"; replay commit(s) {', '.join(sorted(commits))}; CPU {host.get('cpu')}"
        f" ({host.get('logical_cores')} logical cores); target `{json.dumps(config)}`.",
        "",
        f"Three libraries per run, all of a model's timed interleaved in one process,"
        f" {PASSES} passes: **B**, the run's library as"
        f" tuned by all of B; **cut**, its database as it stood at {1 - args.share:.0%} of B"
        f" compiled with the recorded bests; **confirmed**, that cut with each task's"
        f" {args.top_k} fastest records and default re-timed quietly (3 rotations, the CLI's"
        f" evaluator, {args.share * args.budget:.0f} s deadline) and the quietly fastest"
        " compiled, which is what `gradtune tune --time-budget B --confirm K` ships. A ratio is"
        " taken within each pass and its median over the passes given (ms columns: medians over"
        " passes and runs); above 1, the confirmed library is faster. B / confirmed weighs the"
        " change as a whole (the search gives up its last share); cut / confirmed weighs the"
        " confirmation alone.",
        "",
        "| model | searcher | runs | ms B / cut / confirmed (medians) | B / confirmed per run |"
        " cut / confirmed per run | median B / confirmed | median cut / confirmed |"
        " confirm s (max) | tasks changed / confirmed |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    e2e = []
    for model, result in models.items():
        for searcher in ("gradient", "evolutionary"):
            r = result.get(searcher)
            if r is None:
                continue
            pairs = zip(r["changed_tasks"], r["tasks_confirmed"], strict=True)
            lines.append(
                f"| {model} | {searcher} | {r['runs']} | {r['ms_plain_median']:.3f} /"
                f" {r['ms_recorded_median']:.3f} / {r['ms_confirmed_median']:.3f} |"
                f" {', '.join(f'{x:.3f}' for x in r['ratios'])} |"
                f" {', '.join(f'{x:.3f}' for x in r['confirm_only_ratios'])} |"
                f" {r['ratio_median']:.3f} | {r['confirm_only_ratio_median']:.3f} |"
                f" {r['confirm_s_max']:.0f} | {', '.join(f'{c}/{n}' for c, n in pairs)} |"
            )
        if "e2e_evo_over_grad_plain" in result:
            e2e.append(
                f"- {model}: at B {result['e2e_evo_over_grad_plain']:.3f}; both confirmed"
                f" {result['e2e_evo_over_grad_confirmed']:.3f}; gradient confirmed, evolutionary"
                f" at B {result['e2e_evo_plain_over_grad_confirmed']:.3f}."
            )
    if e2e:
        lines += ["", "End to end, evolutionary / gradient (medians):", "", *e2e]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # The layout holds both searchers' runs (an ablation's has the evolutionary ones copied in).
    layout = Layout(args.work.resolve(), args.budget, args.gradient_config)
    models, commits = {}, set()
    for model in args.models:
        results = [r for r in layout.results(model) if "error" not in r]
        if not results:
            print(f"confirm_replay: no finished runs of {model} in {layout.root}", file=sys.stderr)
            return 2
        replays = [replay_run(layout, r, args.share, args.top_k) for r in results]
        commits |= {r["commit"] for r in replays}
        timing = time_model(layout, model, replays, args.share, args.top_k)
        models[model] = summarize(model, replays, timing)
    text = render(args, models, commits)
    stem = STEM + (f"_{args.gradient_config}" if args.gradient_config else "")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.md").write_text(text)
    summary = {"models": models, "share": args.share, "top_k": args.top_k,
               "commit": sorted(commits)}  # fmt: skip
    write_json(args.out / f"{stem}.json", summary)
    print(text)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
