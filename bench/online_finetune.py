"""How strongly should the search fine-tune its cost model on what it measures? A replay.

On models the cost model never saw, the pretrained ranking is weak (median per-batch Spearman
0.27–0.30 on an outside CNN), so what the search learns from its own measurements decides how
good its later picks are. This replays real tuning runs of the search benchmark's held-out
models (``bench/search_efficiency.py``'s run databases, any searcher) through
``OnlineCostModel`` exactly as a session sees them: batch by batch in the order MetaSchedule
committed them, each batch scored *before* the model is fine-tuned on it. It needs no device
time, so fine-tuning settings can be compared on identical measurements, which a tuning run
cannot do (each setting would measure different programs).

Per setting it prints, over every batch of ≥ 3 valid measurements:

- ``spearman``: median rank correlation between the scores and the measured speeds;
- ``top1_regret``: geometric mean of (measured latency of the top-scored candidate) / (batch
  best): what picking by score costs, 1.0 is perfect;
- ``finetune_ms``: mean time of one fine-tune (it sits on the search's critical path).

Beside the settings, the row ``metaschedule_xgb`` replays MetaSchedule's ``XGBModel`` (its
defaults, as the task scheduler trains it for the evolutionary explorer and the peer): one model
per run, from nothing, updated on every batch after scoring it, on TVM's own features: does the
model the hybrid's explorer follows rank a held-out model's batches better than the MLP its
descent follows? Each row is also broken down per model.

``--pretrain-fractions`` asks instead whether more pretraining data would help: one row per
share F of the dataset's workloads (drawn at random, ``--fraction-seeds`` draws each; F = 0 is
the untrained network), pretrained like the benchmark's leave-out weights on that share minus
the model's own workloads, then replayed with the default fine-tune. ``spearman_first`` is the
median over each workload's first batch of a run, where nothing but the pretraining speaks.

Each run starts from the weights pretrained without its model (the benchmark's leave-out
weights named in ``prepared/<model>.json``), so nothing leaks. The last line is one JSON object.

    python bench/online_finetune.py --work bench/work --budget 480
    python bench/online_finetune.py --work bench/work --budget 480 --pretrain-fractions 0 0.25 0.5 1
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# (name, epochs, lr): today's default first.
SETTINGS = [
    ("epochs4_lr3e-4", 4, 3e-4),
    ("epochs16_lr3e-4", 16, 3e-4),
    ("epochs4_lr1e-3", 4, 1e-3),
    ("epochs16_lr1e-3", 16, 1e-3),
    ("epochs32_lr1e-3", 32, 1e-3),
    ("none", 0, 0.0),
]
XGB = "metaschedule_xgb"


def batches_of(db_dir: Path, target: Any) -> list[Any]:
    """A run's measured batches in commit order, featurized: [WorkloadData] (one workload
    each). A batch is a maximal run of consecutive records of one workload, cut at 64."""
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms

    from gradtune.costmodel.featurize import from_records

    database = ms.database.JSONDatabase(
        path_workload=str(db_dir / "database_workload.json"),
        path_tuning_record=str(db_dir / "database_tuning_record.json"),
        allow_missing=False,
    )
    records = list(database.get_all_tuning_records())
    chunks: list[list[Any]] = []
    last = None
    for record in records:
        key = tvm_ffi.structural_hash(record.workload.mod)
        if key != last or len(chunks[-1]) >= 64:
            chunks.append([])
        chunks[-1].append(record)
        last = key
    out = []
    for chunk in chunks:
        out.extend(from_records(chunk, target))
    return out


def cached_batches(db_dir: Path, target: Any, schedules: bool = False) -> list[Any]:
    """``batches_of``, featurized once per run (replaying traces is most of the time): kept
    beside the run's database, keyed by the record file's size and mtime."""
    import torch

    from gradtune.costmodel.featurize import WorkloadData

    records = db_dir / "database_tuning_record.json"
    stamp = [records.stat().st_size, records.stat().st_mtime_ns]
    cache = db_dir.parent / "replay_features.pt"
    if cache.is_file() and not schedules:  # the cache keeps no schedules (TVM objects)
        blob = torch.load(cache, weights_only=False)
        if blob.get("stamp") == stamp:
            return [WorkloadData(b["key"], None, "", None, [], *b["data"]) for b in blob["batches"]]
    batches = batches_of(db_dir, target)
    kept = [{"key": b.key, "data": (b.latencies, b.symbolic)} for b in batches]
    torch.save({"stamp": stamp, "batches": kept}, cache)
    return batches


def _row(scores: np.ndarray, latencies: np.ndarray) -> dict[str, float]:
    from pretrain_source import speed_spearman

    top = int(np.argmax(scores))
    return {
        "spearman": speed_spearman(scores, latencies, np.arange(len(latencies))),
        "regret": float(latencies[top] / latencies.min()),
    }


def replay_xgb(batches: list[Any]) -> list[dict[str, float]]:
    """MetaSchedule's XGBModel, replayed as the task scheduler trains it: scored, then updated."""
    from tvm.s_tir import meta_schedule as ms

    from gradtune.costmodel.evaluate import _candidates, _results

    xgb = ms.cost_model.XGBModel()
    rows = []
    for data in batches:
        latencies = np.asarray(data.latencies)
        candidates = _candidates(data)
        if len(latencies) >= 3:
            rows.append(_row(np.asarray(xgb.predict(data.context, candidates)), latencies))
        start = time.perf_counter()
        xgb.update(data.context, candidates, _results(data.latencies))
        if rows:
            rows[-1].setdefault("finetune_s", time.perf_counter() - start)
    return rows


def fraction_groups(groups: list[Any], excluded: set[str], fraction: float, seed: int) -> list[Any]:
    """A random ``fraction`` of the groups whose workload is not ``excluded`` (at least one
    when ``fraction`` > 0), the same draw for the same seed."""
    import random

    kept = [g for g in groups if g.name not in excluded]
    if fraction <= 0:
        return []
    return random.Random(seed).sample(kept, max(1, round(fraction * len(kept))))


def fraction_weights(
    base: Path, tag: str, groups: list[Any], excluded: set[str], fraction: float, seed: int
) -> Path:
    """Weights pretrained (params.yaml's ``pretrain``, seed ``seed``) on ``fraction_groups``;
    F = 0: the untrained network of that seed. Cached under ``base``/costmodels by ``tag``
    (the workloads left out, the features file and the training settings)."""
    import torch
    from searchbench import api
    from searchbench.prepare import pretrain_params

    from gradtune.costmodel.model import FelixMLP
    from gradtune.costmodel.pretrain import write_weights

    weights = base / "costmodels" / f"fraction{fraction:g}-seed{seed}-{tag}.pt"
    if weights.is_file():
        return weights
    weights.parent.mkdir(parents=True, exist_ok=True)
    params = {**pretrain_params(), "seed": seed}
    chosen = fraction_groups(groups, excluded, fraction, seed)
    if chosen:
        api.pretrain_leaving_out(chosen, set(), params, weights)
    else:
        torch.manual_seed(seed)
        write_weights(FelixMLP(), weights)
    return weights


def replay(batches: list[Any], weights: Path, epochs: int, lr: float) -> list[dict[str, float]]:
    from gradtune.costmodel import model as mlp
    from gradtune.costmodel.online import OnlineCostModel
    from gradtune.costmodel.train import predict

    online = OnlineCostModel(mlp.load(weights), str(weights), epochs=epochs, lr=lr)
    rows, seen = [], set()
    for data in batches:
        latencies = np.asarray(data.latencies)
        if len(latencies) >= 3:
            rows.append(_row(predict(online.model, data.symbolic), latencies))
            rows[-1]["first"] = data.key not in seen
        seen.add(data.key)
        start = time.perf_counter()
        if epochs > 0:
            online.observe(data.key, list(data.symbolic), list(latencies))
        if rows:
            rows[-1].setdefault("finetune_s", time.perf_counter() - start)
    return rows


def _summary(rows: list[dict[str, float]]) -> dict[str, float]:
    if not rows:
        return {"spearman_median": math.nan, "top1_regret_geomean": math.nan,
                "finetune_ms_mean": math.nan, "batches": 0}  # fmt: skip
    regret = np.exp(np.mean([np.log(r["regret"]) for r in rows]))
    finetune_ms = 1e3 * float(np.mean([r.get("finetune_s", 0.0) for r in rows]))
    first = [r["spearman"] for r in rows if r.get("first")]
    return {
        "spearman_median": round(float(np.median([r["spearman"] for r in rows])), 3),
        "spearman_first_median": round(float(np.median(first)), 3) if first else math.nan,
        "top1_regret_geomean": round(float(regret), 3),
        "finetune_ms_mean": round(finetune_ms, 1),
        "batches": len(rows),
    }


def fractions_of(
    base: Path, models: list[str], fractions: list[float], seeds: int
) -> dict[tuple[str, str], Path]:
    """(row name, model) → the weights of ``--pretrain-fractions``, each model's own
    workloads left out as the benchmark leaves them out (``searchbench.prepare``)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from searchbench import api
    from searchbench.models import MODELS
    from searchbench.prepare import excluded_workloads, features_path, file_sha1, pretrain_params

    groups = api.training_groups(features_path(), pretrain_params()["machines"])
    names = {g.name for g in groups}
    # What else decides the weights: the features file's content and params.yaml's training
    # settings (the seed is in the file name, the paths say nothing).
    paths = ("seed", "weights", "features")
    settings = {k: v for k, v in pretrain_params().items() if k not in paths}
    trained_on = {**settings, "features_sha1": file_sha1(features_path())}
    manifest = api.manifest_workloads(ROOT / "data")
    out = {}
    for model in models:
        keys = json.loads((base / "prepared" / f"{model}.json").read_text())["task_keys"]
        excluded, _, _ = excluded_workloads(MODELS[model], keys, manifest)
        # Models that remove the same workloads (none, for held-out ones) share weights.
        identity = json.dumps({"removed": sorted(excluded & names), **trained_on}, sort_keys=True)
        tag = hashlib.sha1(identity.encode()).hexdigest()[:16]
        for f in fractions:
            for seed in range(seeds if 0 < f < 1 else 1):
                path = fraction_weights(base, tag, groups, excluded, f, seed)
                out[(f"data{f:g}_seed{seed}", model)] = path
                print(f"{model}: weights of data share {f:g}, seed {seed}: {path}", file=sys.stderr)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=ROOT / "bench" / "work")
    parser.add_argument("--budget", type=int, default=480, help="whose runs to replay")
    parser.add_argument("--models", nargs="+", default=["mbconv_se", "unet_small", "bert_block"])
    parser.add_argument("--settings", nargs="+", choices=[s[0] for s in SETTINGS],
                        help="fine-tuning settings to replay (default: all)")  # fmt: skip
    parser.add_argument("--pretrain-fractions", nargs="+", type=float, metavar="F",
                        help="rows of pretraining on a share F of the dataset instead of the "
                        "fine-tuning settings (0: untrained)")  # fmt: skip
    parser.add_argument("--fraction-seeds", type=int, default=2, metavar="N",
                        help="random draws per share below 1 (default 2)")  # fmt: skip
    parser.add_argument("--no-xgb", dest="xgb", action="store_false",
                        help=f"leave out the {XGB} row (it replays every trace again)")  # fmt: skip
    args = parser.parse_args()

    from gradtune.target import make_target

    base = args.work / f"{args.budget}s"
    if not base.is_dir():
        print(f"online_finetune: error: no benchmark runs under {base}", file=sys.stderr)
        return 2
    runs = []  # (model, run id, batches, weights)
    for model in args.models:
        prepared = base / "prepared" / f"{model}.json"
        if not prepared.is_file():
            print(f"{model}: not prepared under {base}, skipped", file=sys.stderr)
            continue
        info = json.loads(prepared.read_text())
        target = make_target(info["target"])
        for run in sorted((base / "runs" / model).glob("*-r*")):
            db = run / "db"
            if not (run / "result.json").is_file() or not (db / "database_workload.json").is_file():
                continue
            # Only the XGBoost row needs schedules, and they are what the cache cannot keep.
            schedules = args.xgb and args.pretrain_fractions is None
            batches = cached_batches(db, target, schedules=schedules)
            runs.append((model, run.name, batches, Path(info["weights"])))
            print(f"{model}/{run.name}: {len(batches)} batches", file=sys.stderr)
    if not runs:
        print(f"online_finetune: error: no finished runs under {base}", file=sys.stderr)
        return 2
    results = {}
    models = list(dict.fromkeys(m for m, _, _, _ in runs))
    print(
        f"{'setting':<18} {'spearman':>9} {'first':>7} {'top1_regret':>12} {'finetune_ms':>12}"
        f" {'batches':>8}" + "".join(f" {'rho ' + m:>16}" for m in models)
    )
    settings = [s for s in SETTINGS if s[0] in args.settings] if args.settings else SETTINGS
    if args.pretrain_fractions is not None:
        weights_of = fractions_of(base, models, args.pretrain_fractions, args.fraction_seeds)
        rows_of = dict.fromkeys(name for name, _ in weights_of)  # in the order drawn
        settings = [(name, *SETTINGS[0][1:]) for name in rows_of]
    elif args.xgb:
        settings = [*settings, (XGB, 0, 0.0)]
    for name, epochs, lr in settings:
        per_model: dict[str, list[dict[str, float]]] = {m: [] for m in models}
        for model, _, batches, weights in runs:
            if name == XGB:
                per_model[model] += replay_xgb(batches)
            else:
                if args.pretrain_fractions is not None:
                    weights = weights_of[(name, model)]
                per_model[model] += replay(batches, weights, epochs, lr)
        rows = [r for m in models for r in per_model[m]]
        result = {"epochs": epochs, "lr": lr, **_summary(rows)}
        result["models"] = {m: _summary(per_model[m]) for m in models}
        results[name] = result
        print(
            f"{name:<18} {result['spearman_median']:>9.3f} {result['spearman_first_median']:>7.3f}"
            f" {result['top1_regret_geomean']:>12.3f}"
            f" {result['finetune_ms_mean']:>12.1f} {result['batches']:>8}"
            + "".join(f" {result['models'][m]['spearman_median']:>16.3f}" for m in models)
        )
    from searchbench.report import git_commit

    commit = git_commit()
    runs_desc = sorted({f"{m}/{r}" for m, r, _, _ in runs})
    summary = {"commit": commit, "budget": args.budget, "runs": runs_desc, "settings": results}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
