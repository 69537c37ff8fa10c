"""Whose measurements should the cost model be pretrained on? Leave-one-model-out across datasets.

The search ranks programs timed on the target's cores, but the bundled dataset (``data/``) was
measured before gradtune set TVM's thread count: TVM's runtime then ran one thread on a 2-core
VM without SMT, so its records say nothing of what a parallel loop is worth on two. This
benchmark asks whether that matters, with no tuning run in the way: the same zoo workloads
measured again under other conditions (``gradtune dataset collect --zoo bench/zoo_bundled.yaml``
on 2 threads, say) make a second dataset; every source is pretrained exactly like the bundled
weights (params.yaml's ``pretrain``), one zoo model left out at a time (every workload that
model uses, by structural hash, every batch size); each fold's weights then rank the held-out
model's records of the ``--test`` dataset.

Only the measurements differ between sources: training uses the workloads every dataset holds,
and each training workload is cut to the same number of records in every source (the smallest
count, a seeded random subset), so neither source wins by having more. Per source it prints,
over the test workloads: median and mean Spearman between scores and measured speeds (and
within each workload's fastest quarter, the spread a search batch late in a run has), pairwise
ranking accuracy, top-1 regret (latency of the top-scored program over the workload's best,
geometric mean) and top-5 recall; then a paired count of test workloads on which each source
ranked better. Each fold's weights are cached under ``--work`` (resumable; another
``--test`` reuses them); the last line is one JSON object.

``--epochs`` with several lengths compares training lengths instead of (or beside) sources:
one row per source and length (``source@E``), each fold trained once, to the longest length,
and snapshotted at the shorter ones on its way (the very nets shorter runs end in). One
source is then enough.

    .venv/bin/gradtune dataset collect --zoo bench/zoo_bundled.yaml \\
        --out data-2threads --random 48 --evolutionary 16 --time-budget 3600
    .venv/bin/python bench/pretrain_source.py \\
        --train one_thread=data two_threads=data-2threads --test two_threads --seeds 3
    .venv/bin/python bench/pretrain_source.py \\
        --train one_thread=data two_threads=data-2threads --test two_threads --seeds 3 \\
        --epochs 40 160
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def parse_sources(items: list[str]) -> dict[str, Path]:
    """``NAME=DIR`` pairs → {name: dataset directory}; a bad item is a one-line error."""
    out: dict[str, Path] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise SystemExit(f"pretrain_source: error: --train takes NAME=DIR, not {item!r}")
        if name in out:
            raise SystemExit(f"pretrain_source: error: source {name!r} given twice")
        folder = Path(path) if Path(path).is_absolute() else ROOT / path
        if not (folder / "manifest.json").is_file():
            raise SystemExit(f"pretrain_source: error: {folder} is no dataset (no manifest.json)")
        out[name] = folder
    return out


def dataset_stamp(folder: Path) -> str:
    """What decides a dataset's features: its record file's content hash."""
    records = folder / "database_tuning_record.json.gz"
    if not records.is_file():
        records = folder / "database_tuning_record.json"
    return hashlib.sha1(records.read_bytes()).hexdigest()[:16]


def features_of(name: str, folder: Path, work: Path) -> dict[str, Any]:
    """The featurized dataset (``featurize_dataset``), cached in ``work`` by its content."""
    import torch

    from gradtune.costmodel.featurize import featurize_dataset

    path = work / f"features-{name}-{dataset_stamp(folder)}.pt"
    if not path.is_file():
        print(f"{name}: featurizing {folder} ...", file=sys.stderr, flush=True)
        print(f"{name}: {json.dumps(featurize_dataset(folder, path))}", file=sys.stderr)
    return torch.load(path, map_location="cpu", weights_only=False)


def workloads_of(blob: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Workload key → its entry (machine's records merged, if a dataset has several)."""
    out: dict[str, dict[str, Any]] = {}
    for w in blob["workloads"]:
        entry = out.setdefault(
            w["key"], {"family": w["family"], "models": set(), "programs": [], "latencies": []}
        )
        entry["models"] |= set(w.get("models") or [])
        entry["programs"] += list(w["programs"])
        entry["latencies"] += list(w["latencies"])
    return out


def cut(entry: dict[str, Any], count: int, seed: int) -> tuple[list[Any], np.ndarray]:
    """``count`` of the entry's records, a seeded random subset (all of them when fewer)."""
    latencies = np.asarray(entry["latencies"], dtype=float)
    idx = np.arange(len(latencies))
    if len(idx) > count:
        idx = np.sort(np.random.default_rng(seed).choice(idx, count, replace=False))
    return [entry["programs"][i] for i in idx], latencies[idx]


def shared(data: dict[str, dict[str, dict[str, Any]]]) -> tuple[set[str], dict[str, int]]:
    """The workloads every source holds with two or more records, and per workload the record
    count every source is cut to (the smallest)."""
    common = set.intersection(*(set(d) for d in data.values()))
    common = {k for k in common if all(len(d[k]["latencies"]) >= 2 for d in data.values())}
    return common, {k: min(len(d[k]["latencies"]) for d in data.values()) for k in common}


def held_out(common: set[str], test_data: dict[str, dict[str, Any]], model: str) -> set[str]:
    """Every shared workload ``model`` uses (at any batch size): what its fold trains without.
    A workload two models share leaves training with either."""
    return {k for k in common if model in test_data[k]["models"]}


def best_quarter(latencies: np.ndarray) -> np.ndarray:
    """Indices of a workload's fastest quarter of records (at least 8). A search batch holds
    programs near the best, not a random spread: the ranking that matters late in a run is
    the one within these."""
    return np.argsort(latencies, kind="stable")[: max(8, len(latencies) // 4)]


def speed_spearman(scores: np.ndarray, latencies: np.ndarray, idx: np.ndarray) -> float:
    """Spearman of ``scores`` against speed over the records ``idx``; 0 where it is undefined
    (constant scores or latencies)."""
    from gradtune.costmodel.train import spearman

    rho = spearman(scores[idx], -latencies[idx])
    return 0.0 if math.isnan(rho) else rho


def fold_metrics(scores: np.ndarray, latencies: np.ndarray) -> dict[str, float]:
    from gradtune.costmodel.train import group_metrics

    metrics = group_metrics(scores, latencies)
    metrics["regret"] = float(latencies[int(np.argmax(scores))] / latencies.min())
    metrics["spearman_best_quarter"] = speed_spearman(scores, latencies, best_quarter(latencies))
    return metrics


def fold_weights(
    source: str,
    model: str,
    seed: int,
    train: dict[str, dict[str, Any]],
    counts: dict[str, int],
    params: dict[str, Any],
    paths: dict[int, Path],
) -> dict[int, Any]:
    """Per training length E in ``paths``: the network pretrained for E epochs on ``train``
    (each workload cut to ``counts``) with ``seed``, cached at ``paths[E]``, so a fold is
    trained once whatever it is tested on. One run to the longest length snapshots the
    shorter ones on its way: they are the very states a shorter run ends in."""
    import copy

    from gradtune.costmodel import model as mlp
    from gradtune.costmodel.pretrain import train as pretrain
    from gradtune.costmodel.pretrain import write_weights
    from gradtune.costmodel.train import Group

    if all(p.is_file() for p in paths.values()):
        return {e: mlp.load(p) for e, p in paths.items()}
    groups = []
    for key, entry in sorted(train.items()):
        programs, latencies = cut(entry, counts[key], seed)
        groups.append(Group(key, entry["family"], programs, latencies))
    print(
        f"{source} without {model}, seed {seed}: {len(groups)} workloads, "
        f"{sum(len(g.latencies) for g in groups)} records",
        file=sys.stderr,
        flush=True,
    )
    nets: dict[int, Any] = {}

    def snapshot(epoch: int, net: Any) -> None:
        if epoch in paths:
            nets[epoch] = copy.deepcopy(net).eval()
            write_weights(nets[epoch], paths[epoch])

    pretrain(groups, params["loss"], max(paths), float(params["lr"]), seed, on_epoch=snapshot)
    return nets


def score(net: Any, test: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per test workload: how ``net`` ranks its records."""
    from gradtune.costmodel.train import predict

    out = {}
    for key, entry in sorted(test.items()):
        latencies = np.asarray(entry["latencies"], dtype=float)
        out[key] = fold_metrics(predict(net, entry["programs"]), latencies)
        out[key]["family"] = entry["family"]
    return out


def summarize(rows: list[dict[str, float]]) -> dict[str, float]:
    if not rows:
        return {"workloads": 0}
    rho = [r["spearman"] for r in rows]
    return {
        "spearman_median": round(float(np.median(rho)), 3),
        "spearman_mean": round(float(np.mean(rho)), 3),
        "spearman_best_quarter_median": round(
            float(np.median([r["spearman_best_quarter"] for r in rows])), 3
        ),
        "pairwise": round(float(np.nanmean([r["pairwise"] for r in rows])), 3),
        "top1_regret_geomean": round(
            float(np.exp(np.mean([math.log(r["regret"]) for r in rows]))), 3
        ),
        "top5": round(float(np.mean([r["top5"] for r in rows])), 3),
        "workloads": len(rows),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--train",
        nargs="+",
        required=True,
        metavar="NAME=DIR",
        help="datasets to pretrain on, by name",
    )
    parser.add_argument(
        "--test", required=True, metavar="NAME", help="the source whose held-out records are ranked"
    )
    parser.add_argument("--models", nargs="+", help="zoo models to hold out (default: all)")
    parser.add_argument("--seeds", type=int, default=1, help="training seeds per fold")
    parser.add_argument(
        "--loss",
        default=None,
        help="pretraining loss (default: params.yaml's; rank, mse, rank_top)",
    )
    parser.add_argument(
        "--epochs",
        type=int,
        nargs="+",
        default=None,
        help="pretraining epochs (default: params.yaml's); several compare training lengths, "
        "each fold trained once to the longest",
    )
    parser.add_argument("--work", type=Path, default=ROOT / "bench" / "work" / "pretrain_source")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results directory (default: bench/results, or WORK/results "
        "with a --work of your own)",
    )
    args = parser.parse_args(argv)
    sources = parse_sources(args.train)
    if args.test not in sources:
        print(
            f"pretrain_source: error: --test {args.test!r} is none of {', '.join(sources)}",
            file=sys.stderr,
        )
        return 2
    if args.seeds < 1:
        print("pretrain_source: error: --seeds must be at least 1", file=sys.stderr)
        return 2
    import yaml

    from gradtune.costmodel.train import LOSSES

    params = yaml.safe_load((ROOT / "params.yaml").read_text())["pretrain"]
    if args.loss is not None:
        if args.loss not in LOSSES:
            print(
                f"pretrain_source: error: --loss must be one of {', '.join(LOSSES)}, "
                f"not {args.loss!r}",
                file=sys.stderr,
            )
            return 2
        params["loss"] = args.loss
    if args.epochs is not None and min(args.epochs) < 1:
        print("pretrain_source: error: --epochs must be at least 1", file=sys.stderr)
        return 2
    lengths = sorted(set(args.epochs or [int(params["epochs"])]))
    if len(sources) * len(lengths) < 2:
        print(
            "pretrain_source: error: nothing to compare: give --train at least two sources, "
            "or --epochs at least two lengths",
            file=sys.stderr,
        )
        return 2

    def row_name(source: str, epochs: int) -> str:
        """A row of the comparison: a source at a training length."""
        return f"{source}@{epochs}" if len(lengths) > 1 else source

    rows = [row_name(name, e) for name in sources for e in lengths]
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    data = {name: workloads_of(features_of(name, folder, work)) for name, folder in sources.items()}
    common, counts = shared(data)
    if not common:
        print("pretrain_source: error: the datasets share no workload", file=sys.stderr)
        return 2
    test_data = data[args.test]
    zoo = sorted(set().union(*(test_data[k]["models"] for k in common)))
    models = args.models or zoo
    unknown = [m for m in models if m not in zoo]
    if unknown:
        print(
            f"pretrain_source: error: no shared workload of {', '.join(unknown)}; the test "
            f"data's models are {', '.join(zoo)}",
            file=sys.stderr,
        )
        return 2
    print(
        f"{len(common)} workloads in every source (of "
        + ", ".join(f"{n}: {len(d)}" for n, d in data.items())
        + f"); folds: {', '.join(models)}",
        file=sys.stderr,
        flush=True,
    )
    identity = json.dumps(
        {k: v for k, v in params.items() if k not in ("weights", "features", "epochs")}
        | {n: dataset_stamp(f) for n, f in sources.items()},
        sort_keys=True,
    )
    tag = hashlib.sha1(identity.encode()).hexdigest()[:12]
    per: dict[str, dict[str, dict[str, dict[str, float]]]] = {r: {} for r in rows}
    for model in models:
        # Every workload the held-out model uses leaves training, in every source.
        held = held_out(common, test_data, model)
        test = {k: test_data[k] for k in held}
        for seed in range(args.seeds):
            for name in sources:
                train = {k: data[name][k] for k in common - held}
                paths = {
                    e: work / "folds" / tag / f"{name}-{model}-s{seed}-e{e}.pt" for e in lengths
                }
                nets = fold_weights(name, model, seed, train, counts, params, paths)
                for e, net in nets.items():
                    for key, row in score(net, test).items():
                        per[row_name(name, e)].setdefault(key, {})[str(seed)] = row | {
                            "model": model
                        }
    # A test workload's row per source: its metrics averaged over seeds.
    rows_of: dict[str, dict[str, dict[str, float]]] = {}
    for name, by_key in per.items():
        rows_of[name] = {}
        for key, by_seed in by_key.items():
            seeds = list(by_seed.values())
            row = {
                m: float(np.mean([s[m] for s in seeds]))
                for m in ("spearman", "spearman_best_quarter", "pairwise", "top1", "top5")
            }
            row["regret"] = float(np.exp(np.mean([math.log(s["regret"]) for s in seeds])))
            row["model"], row["family"] = seeds[0]["model"], seeds[0]["family"]
            rows_of[name][key] = row
    results: dict[str, Any] = {}
    for name in rows:
        rows_here = list(rows_of[name].values())
        results[name] = summarize(rows_here)
        results[name]["models"] = {
            m: summarize([r for r in rows_here if r["model"] == m]) for m in models
        }
        families = sorted({r["family"] for r in rows_here})
        results[name]["families"] = {
            f: summarize([r for r in rows_here if r["family"] == f]) for f in families
        }
    names = list(rows)
    wins = {n: 0 for n in names}
    for key in rows_of[names[0]]:
        scores = {n: rows_of[n][key]["spearman"] for n in names}
        best = max(scores.values())
        leaders = [n for n in names if scores[n] == best]
        if len(leaders) == 1:
            wins[leaders[0]] += 1
    from searchbench.report import git_commit

    summary = {
        "commit": git_commit(),
        "test": args.test,
        "sources": {
            n: str(f.relative_to(ROOT) if f.is_relative_to(ROOT) else f) for n, f in sources.items()
        },
        "shared_workloads": len(common),
        "records_per_workload_median": float(np.median(list(counts.values()))),
        "seeds": args.seeds,
        "loss": params["loss"],
        "epochs": lengths,
        "held_out_models": models,
        "results": results,
        "wins": wins,
    }
    out = args.out or (
        ROOT / "bench" / "results" if args.work == parser.get_default("work") else work / "results"
    )
    out.mkdir(parents=True, exist_ok=True)
    stem = (
        f"pretrain_source_{args.test}"
        + (f"_{args.loss}" if args.loss else "")
        + (f"_epochs{'-'.join(map(str, lengths))}" if args.epochs else "")
    )
    (out / f"{stem}.json").write_text(json.dumps(summary, indent=1) + "\n")
    table = markdown(summary, models)
    (out / f"{stem}.md").write_text(table)
    print(table)
    print(
        json.dumps(
            {k: summary[k] for k in ("commit", "test", "shared_workloads", "wins")}
            | {
                "spearman_median": {n: results[n]["spearman_median"] for n in names},
                "top1_regret_geomean": {n: results[n]["top1_regret_geomean"] for n in names},
            }
        )
    )
    return 0


def markdown(summary: dict[str, Any], models: list[str]) -> str:
    names = list(summary["results"])
    lines = [
        f"# Pretraining sources ranked on held-out {summary['test']} records",
        "",
        f"Commit {summary['commit']}. Sources: "
        + ", ".join(f"`{n}` = `{p}`" for n, p in summary["sources"].items())
        + f". Pretraining loss `{summary['loss']}`, "
        + "/".join(map(str, summary["epochs"]))
        + " epochs (a row `source@E` is E epochs of one training run). "
        f"{summary['shared_workloads']} workloads in "
        "every source, cut to the same "
        f"records per workload (median {summary['records_per_workload_median']:g}); each zoo "
        f"model held out in turn, {summary['seeds']} training seed(s) per fold.",
        "",
        "| source | spearman median | mean | best quarter | pairwise | top-1 regret | top-5 "
        "| wins |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in names:
        r = summary["results"][n]
        lines.append(
            f"| {n} | {r['spearman_median']:.3f} | {r['spearman_mean']:.3f} | "
            f"{r['spearman_best_quarter_median']:.3f} | "
            f"{r['pairwise']:.3f} | {r['top1_regret_geomean']:.3f} | {r['top5']:.3f} | "
            f"{summary['wins'][n]} |"
        )
    families = sorted(summary["results"][names[0]]["families"])
    lines += breakdown(summary, "models", "held-out model", models)
    lines += breakdown(summary, "families", "operator family", families)
    return "\n".join(lines) + "\n"


def breakdown(summary: dict[str, Any], part: str, title: str, keys: list[str]) -> list[str]:
    """A markdown table of each source's Spearman median per ``part`` (models or families)."""
    names = list(summary["results"])
    lines = ["", f"Spearman median per {title}:", "",
             f"| {title} | workloads | " + " | ".join(names) + " |",
             "|---|---:|" + "---:|" * len(names)]  # fmt: skip
    for key in keys:
        count = summary["results"][names[0]][part][key].get("workloads", 0)
        medians = [summary["results"][n][part][key].get("spearman_median", math.nan) for n in names]
        lines.append(f"| {key} | {count} | " + " | ".join(f"{v:.3f}" for v in medians) + " |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
