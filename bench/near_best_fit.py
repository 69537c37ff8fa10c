"""Can the cost model tell a workload's near-best programs apart at all? Fits inside one workload.

``label_noise.py`` says two timings of the same programs agree at a Spearman of ~0.77 within
each workload's fastest quarter, while the pretrained MLP ranks a held-out workload's fastest
quarter at ~0.21 (``pretrain_source.py``). That gap has three possible owners: the features
(programs that time apart but look alike to the model), the network and its training (it
could tell them apart but was not fitted to), or generalization (it fits its training
workloads but not new ones). Per workload of the dataset, three rows tell them apart:

- **two timings**: ``label_noise``'s agreement, what the noise leaves to rank;
- **weights, own records**: the given weights (default: the bundled ones) ranking the records
  they were trained on. If this is low too, the pretraining did not fit the top;
- **one workload, fresh**: a fresh ``FelixMLP`` trained on a seeded half of one workload's
  records alone (params.yaml's loss and learning rate, ``--epochs`` passes), ranking the
  other half, and its own half. High on its own half and low on the other: the features
  separate the programs but 64 records do not teach it; low on both: the features or the
  network cannot separate them.

Every row's Spearman is over all of a workload's (test) records and over their fastest
quarter (``pretrain_source.best_quarter``); medians over workloads. The last line is JSON.

    .venv/bin/python bench/near_best_fit.py --data data --features features/llvm.pt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def ranking(scores: np.ndarray, latencies: np.ndarray) -> dict[str, float]:
    """Spearman of ``scores`` against speed, over all records and over the fastest quarter."""
    from pretrain_source import best_quarter, speed_spearman

    return {
        "all": speed_spearman(scores, latencies, np.arange(len(latencies))),
        "quarter": speed_spearman(scores, latencies, best_quarter(latencies)),
    }


def halves(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded split of ``count`` records into two halves (train, test)."""
    order = np.random.default_rng(seed).permutation(count)
    return np.sort(order[: count // 2]), np.sort(order[count // 2 :])


def fresh_fit(entry: dict[str, Any], params: dict[str, Any], epochs: int, seed: int) -> dict:
    """A fresh network trained on one half of one workload's records; how it ranks each half."""
    from gradtune.costmodel.pretrain import train
    from gradtune.costmodel.train import Group, predict

    latencies = np.asarray(entry["latencies"], dtype=float)
    train_idx, test_idx = halves(len(latencies), seed)
    programs = entry["programs"]
    group = Group("w", entry["family"], [programs[i] for i in train_idx], latencies[train_idx])
    net, _ = train([group], params["loss"], epochs, float(params["lr"]), seed)
    own = ranking(predict(net, group.programs), latencies[train_idx])
    other = ranking(predict(net, [programs[i] for i in test_idx]), latencies[test_idx])
    return {"own_" + k: v for k, v in own.items()} | {"other_" + k: v for k, v in other.items()}


def median_of(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: round(float(np.median([r[k] for r in rows])), 3) for k in rows[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="the dataset directory")
    parser.add_argument(
        "--features", type=Path, default=None,
        help="the dataset featurized (featurize_dataset), e.g. features/llvm.pt for data/; "
        "default: featurized into --work",
    )  # fmt: skip
    parser.add_argument(
        "--weights", type=Path, default=None, help="weights to rank their own records "
        "(default: params.yaml's pretrain weights, the bundled ones)",
    )  # fmt: skip
    parser.add_argument("--epochs", type=int, default=200, help="passes of a one-workload fit")
    parser.add_argument("--seeds", type=int, default=1, help="splits (and training seeds)")
    parser.add_argument("--min-records", type=int, default=32, help="records a workload needs")
    parser.add_argument("--work", type=Path, default=ROOT / "bench" / "work" / "near_best_fit")
    parser.add_argument("--out", type=Path, default=None, help="write near_best_fit.{md,json}")
    args = parser.parse_args(argv)
    import yaml
    from label_noise import publish, record_file
    from label_noise import summarize as noise_of
    from searchbench.report import git_commit

    record_file(args.data)  # one line, before any work, when it is no dataset
    params = yaml.safe_load((ROOT / "params.yaml").read_text())["pretrain"]
    weights = args.weights or ROOT / params["weights"]
    for path, what in ((weights, "--weights"), (args.features, "--features")):
        if path is not None and not path.is_file():
            raise SystemExit(f"near_best_fit: error: {what} {path} is no file")
    if args.epochs < 1 or args.seeds < 1:
        raise SystemExit("near_best_fit: error: --epochs and --seeds must be at least 1")
    import torch
    from pretrain_source import features_of, workloads_of

    from gradtune.costmodel import model as mlp
    from gradtune.costmodel.train import predict

    torch.set_num_threads(1)  # a one-workload fit is too small to gain from two
    blob = (
        torch.load(args.features, map_location="cpu", weights_only=False)
        if args.features
        else features_of(args.data.name, args.data, args.work)
    )
    entries = {
        k: e for k, e in workloads_of(blob).items() if len(e["latencies"]) >= args.min_records
    }
    net = mlp.load(weights)
    own, fresh = [], []
    for i, (_key, entry) in enumerate(sorted(entries.items())):
        latencies = np.asarray(entry["latencies"], dtype=float)
        own.append(ranking(predict(net, entry["programs"]), latencies))
        fits = [fresh_fit(entry, params, args.epochs, seed) for seed in range(args.seeds)]
        fresh.append({k: float(np.mean([f[k] for f in fits])) for k in fits[0]})
        print(f"\r{i + 1}/{len(entries)} workloads", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    noise = noise_of(args.data, args.min_records)
    summary = {
        "commit": git_commit(),
        "data": str(args.data),
        "workloads": len(entries),
        "weights": str(weights.relative_to(ROOT) if weights.is_relative_to(ROOT) else weights),
        "epochs": args.epochs,
        "seeds": args.seeds,
        "loss": params["loss"],
        "two_timings": {"all": noise["all_median"], "quarter": noise["quarter_median"]},
        "weights_own_records": median_of(own),
        "one_workload_fresh": median_of(fresh),
    }
    publish(args.out, "near_best_fit", summary, markdown(summary))
    return 0


def markdown(s: dict[str, Any]) -> str:
    fresh = s["one_workload_fresh"]
    rows = [
        ("two timings of each program (`label_noise.py`)", s["two_timings"]),
        (f"`{s['weights']}`, ranking the records it was trained on", s["weights_own_records"]),
        (
            f"a fresh MLP per workload, {s['epochs']} passes over half its records: that half",
            {"all": fresh["own_all"], "quarter": fresh["own_quarter"]},
        ),
        (
            "the same, ranking the other half",
            {"all": fresh["other_all"], "quarter": fresh["other_quarter"]},
        ),
    ]
    lines = [
        "# Near-best programs: can the cost model tell them apart?",
        "",
        f"Commit {s['commit']}. Dataset `{s['data']}`, {s['workloads']} workloads; loss "
        f"`{s['loss']}`, {s['seeds']} split(s). Spearman medians over workloads.",
        "",
        "| ranking | all records | fastest quarter |",
        "|---|---:|---:|",
    ]
    lines += [f"| {name} | {r['all']:.3f} | {r['quarter']:.3f} |" for name, r in rows]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
