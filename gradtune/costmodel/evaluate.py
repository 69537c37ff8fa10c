"""``gradtune costmodel eval``: gradtune's MLP against MetaSchedule's XGBModel and MLPModel
(SegmentSumMLP), all trained on exactly the same records, tested on workloads none of them saw.

Splits: ``workload`` holds out a fixed fifth of the workloads (by hash); ``model`` holds out,
in turn, every workload of one model of the zoo (leave-one-model-out, needs the dataset's
manifest). Metrics within each test workload: pairwise ranking accuracy, top-1 / top-5 recall
of the true best candidate, Spearman; averaged per operator family and overall.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from gradtune.costmodel.featurize import WorkloadData, from_records
from gradtune.costmodel.model import FelixMLP
from gradtune.costmodel.train import Group, fit, group_metrics, predict, summarize
from gradtune.dataset.store import Skipped, open_dataset
from gradtune.errors import GradtuneError


def open_records(data_dir: Path) -> list[Any]:
    """Tuning records of a dataset directory (corrupt lines skipped with a count on stderr)."""
    records = list(open_dataset(data_dir).get_all_tuning_records())
    if not records:
        raise GradtuneError(f"{data_dir}: the dataset is empty")
    return records


def _manifest(data_dir: Path) -> dict[str, dict[str, Any]]:
    path = data_dir / "manifest.json"
    if not path.is_file():
        return {}
    raw = json.loads(path.read_text())
    entries = raw.get("workloads", raw)
    if isinstance(entries, list):
        return {str(e.get("hash", e.get("key"))): e for e in entries}
    return {str(k): v for k, v in entries.items()}


def _held_out(key: str) -> bool:
    return int(hashlib.sha1(key.encode()).hexdigest(), 16) % 5 == 0


def folds(data: list[WorkloadData], split: str, manifest: dict) -> list[tuple[str, list, list]]:
    if split == "workload":
        return [("workload", [d for d in data if not _held_out(d.key)],
                 [d for d in data if _held_out(d.key)])]  # fmt: skip
    models_of = {d.key: set(manifest.get(d.key, {}).get("models", [])) for d in data}
    models = sorted(set().union(*models_of.values())) if models_of else []
    if not models:
        raise GradtuneError("the model split needs a manifest mapping workloads to models")
    out = []
    for model in models:
        test = [d for d in data if model in models_of[d.key]]
        train = [d for d in data if model not in models_of[d.key]]
        if test and train:
            out.append((model, train, test))
    return out


def _groups(data: list[WorkloadData]) -> list[Group]:
    return [Group(d.key, d.family, d.symbolic, np.asarray(d.latencies)) for d in data]


def _results(latencies: list[float]) -> list[Any]:
    from tvm.s_tir import meta_schedule as ms

    return [ms.runner.RunnerResult(run_secs=[float(s)], error_msg=None) for s in latencies]


def _candidates(d: WorkloadData) -> list[Any]:
    from tvm.s_tir import meta_schedule as ms

    args = ms.arg_info.ArgInfo.from_prim_func(d.mod["main"])
    return [ms.MeasureCandidate(sch, args) for sch in d.schedules]


def train_ours(train: list[WorkloadData], loss: str, epochs: int) -> FelixMLP:
    model = FelixMLP()
    fit(model, _groups(train), loss=loss, epochs=epochs)
    return model


def peers(train: list[WorkloadData]) -> dict[str, Callable[[WorkloadData], np.ndarray]]:
    """MetaSchedule's XGBModel and MLPModel trained on the same records (TVM's features)."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.cost_model.mlp_model import (
        MLPModel,
        SegmentSumMLPTrainer,
        TrainerConfig,
        extract_features,
    )
    from tvm.s_tir.meta_schedule.utils import shash2hex

    random.seed(0)  # MLPModel's trainer holds out a random fifth of its groups to pick epochs
    xgb = ms.cost_model.XGBModel(num_warmup_samples=0)
    split = max(0.2, 1.0 / len(train) + 1e-9)  # at least one group, or it cannot train
    mlp = MLPModel(trainer=SegmentSumMLPTrainer(TrainerConfig(test_split=split)))
    for d in train:
        candidates, results = _candidates(d), _results(d.latencies)
        xgb.update(d.context, candidates, results)
        feats, costs = extract_features(d.context, candidates, results, mlp.trainer.state.extractor)
        mlp.trainer.state.add_to_group(feats, costs, shash2hex(d.context.mod))
    from gradtune.tvm_compat import steplr_accepts_verbose

    with steplr_accepts_verbose():
        mlp.trainer.train_full()
    return {
        "xgb": lambda d: np.asarray(xgb.predict(d.context, _candidates(d)), dtype=float),
        "ms_mlp": lambda d: np.asarray(mlp.predict(d.context, _candidates(d)), dtype=float),
    }


def evaluate(
    data_dir: str | Path,
    split: str,
    target: Any,
    epochs: int = 40,
    console: Any = None,
    losses: tuple[str, ...] = ("rank", "mse"),
) -> dict[str, Any]:
    data_dir = Path(data_dir)
    if split not in ("workload", "model"):
        raise GradtuneError(f"--split must be workload or model, not {split!r}")
    if not losses or any(loss not in ("rank", "mse") for loss in losses):
        raise GradtuneError(f"losses must be rank and/or mse, not {losses!r}")
    skipped = Skipped()
    records = open_records(data_dir)
    manifest = _manifest(data_dir)
    families = {k: v.get("kernel_class", "") for k, v in manifest.items()}  # → operator family
    data = from_records(records, target, skipped, families)
    if skipped.count and console is not None:
        console.print(f"skipped {skipped.count} records; first: {skipped.first_reason}")
    if not data:
        raise GradtuneError(f"{data_dir}: no workload with two or more usable records")
    per_model: dict[str, list[tuple[str, dict[str, float]]]] = {}
    per_loss: dict[str, list[tuple[str, dict[str, float]]]] = {loss: [] for loss in losses}
    for _, train, test in folds(data, split, manifest):
        if not test or not train:
            continue
        for loss in per_loss:
            model = train_ours(train, loss, epochs)
            for d in test:
                per_loss[loss].append(
                    (d.family, group_metrics(predict(model, d.symbolic), np.asarray(d.latencies)))
                )
        for name, score in peers(train).items():
            for d in test:
                per_model.setdefault(name, []).append(
                    (d.family, group_metrics(score(d), np.asarray(d.latencies)))
                )
    summaries = {loss: summarize(rows) for loss, rows in per_loss.items() if rows}
    if not summaries:
        raise GradtuneError("the split left no test workloads; the dataset is too small")
    best_loss = max(summaries, key=lambda k: summaries[k]["overall"]["pairwise"])
    result = {
        "split": split,
        "ours": summaries[best_loss]["overall"],
        "xgb": summarize(per_model["xgb"])["overall"],
        "ms_mlp": summarize(per_model["ms_mlp"])["overall"],
        "loss": best_loss,
        "other_loss": summaries[{"rank": "mse", "mse": "rank"}[best_loss]]["overall"]
        if len(summaries) == 2
        else None,
        "families": {
            "ours": summaries[best_loss],
            "xgb": summarize(per_model["xgb"]),
            "ms_mlp": summarize(per_model["ms_mlp"]),
        },
        "skipped": skipped.count,
        "test_workloads": len(per_loss[best_loss]),
        "records": sum(len(d.latencies) for d in data),
        "workloads": len(data),
    }
    return result


def print_table(result: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    table = Table(title=f"cost models on held-out workloads (split: {result['split']})")
    for col in ("family", "model", "workloads", "pairwise", "top-1", "top-5", "spearman"):
        table.add_column(col, justify="left" if col in ("family", "model") else "right")
    families = result["families"]["ours"]
    for family in sorted(families, key=lambda f: (f == "overall", f)):
        for model in ("ours", "xgb", "ms_mlp"):
            m = result["families"][model].get(family, {})
            table.add_row(
                family if model == "ours" else "",
                model,
                str(m.get("workloads", "")),
                *(
                    f"{m.get(k, float('nan')):.3f}"
                    for k in ("pairwise", "top1", "top5", "spearman")
                ),
                end_section=model == "ms_mlp",
            )
    console.print(table)
    console.print(f"ours: {result['loss']} loss; with the other loss: {result['other_loss']}")


def write_report(result: dict[str, Any], out_dir: str | Path) -> Path:
    """``costmodel_eval_<split>.md`` (the table) and ``.json`` (everything) in ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"costmodel_eval_{result['split']}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        f"# Cost models on held-out workloads (split: {result['split']})",
        "",
        f"{result['workloads']} workloads, {result['records']} measured records; "
        f"{result['test_workloads']} test workloads"
        + (" (each model of the zoo held out in turn)" if result["split"] == "model" else "")
        + f". Ours: gradtune's MLP on smooth symbolic features, {result['loss']} loss"
        + (f" (the other loss overall: {result['other_loss']})" if result["other_loss"] else "")
        + ". Peers: MetaSchedule's XGBModel and MLPModel on PerStoreFeature, same records.",
        "",
        "| family | model | workloads | pairwise | top-1 | top-5 | spearman |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    families = result["families"]["ours"]
    for family in sorted(families, key=lambda f: (f == "overall", f)):
        for model in ("ours", "xgb", "ms_mlp"):
            m = result["families"][model].get(family, {})
            cells = [
                f"{m.get(k, float('nan')):.3f}" for k in ("pairwise", "top1", "top5", "spearman")
            ]
            name = f"**{family}**" if family == "overall" else family
            lines.append(
                f"| {name} | {model} | {m.get('workloads', '')} | " + " | ".join(cells) + " |"
            )
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return stem.with_suffix(".md")
