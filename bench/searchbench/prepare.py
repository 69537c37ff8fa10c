"""Prepare a benchmark model: import it, find its tasks, pretrain a cost model without them.

The gradient search must not start from a cost model that has seen the benchmark model's
kernels. Left out of pretraining are every workload the dataset manifest attributes to the
model's zoo name (any batch size) and every workload whose structural hash equals one of the
model's own tasks (a held-out model can share a kernel shape with the zoo by chance). The
overlap that remains must be 0; it is asserted and recorded.

Everything else is the ``pretrain`` stage's (params.yaml: loss, epochs, lr, seed, features).
Weights are cached per excluded set, so models that exclude the same workloads share them. A
configuration that scores with a deep ensemble gets one too: the leave-out model and more
members trained on the same data with the next seeds.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import yaml

from searchbench import api
from searchbench.layout import Layout, write_json
from searchbench.models import ROOT, BenchModel

MEMBERS = 4  # of a deep ensemble (GradientConfig acquisition="ei" or contextual_explore)


def pretrain_params() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "params.yaml").read_text())["pretrain"]


def features_path() -> Path:
    return ROOT / pretrain_params()["features"]


def file_sha1(path: Path) -> str:
    digest = hashlib.sha1()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def excluded_workloads(model: BenchModel, task_keys: list[str], manifest: dict[str, Any]):
    """(excluded keys, how many came from the manifest, how many only from task hashes)."""
    from gradtune.costmodel.leave_out import workloads_of_models

    by_model = workloads_of_models(manifest, [model.zoo_name] if model.zoo_name else [])
    by_hash = set(task_keys) - by_model
    return by_model | by_hash, len(by_model), len(by_hash)


def cached_weights(
    layout: Layout, groups: list[Any], excluded: set[str], params: dict[str, Any], features: Path
) -> tuple[Path, dict[str, Any]]:
    """Path of the weights pretrained on ``groups`` without ``excluded`` (trained if not
    cached). Keyed by the workloads actually removed, so models that remove none share one."""
    settings = {k: params[k] for k in ("loss", "epochs", "lr", "seed")}
    removed = sorted(excluded & {g.name for g in groups})
    key = {"removed": removed, "features": file_sha1(features), **settings}
    if params["machines"] != "target":
        # Only a choice other than the default joins the key, so that weights cached before
        # the choice existed (all trained on the target's machines) are still found.
        key["machines"] = params["machines"]
    identity = json.dumps(key, sort_keys=True)
    weights = layout.costmodels / f"{hashlib.sha1(identity.encode()).hexdigest()[:16]}.pt"
    info_path = weights.with_suffix(".json")
    if weights.is_file() and info_path.is_file():
        return weights, json.loads(info_path.read_text())
    info = api.pretrain_leaving_out(groups, excluded, params, weights)
    write_json(info_path, info | settings)
    return weights, info


def prepare(model: BenchModel, layout: Layout) -> dict[str, Any]:
    """Import and partition ``model``, pretrain its leave-out cost model; returns the record
    written to ``layout.prepared(model)``."""
    from gradtune.costmodel.leave_out import leaked

    config, target = api.host_target()
    path = model.tuning_file(layout.work)
    imported = api.import_model(path)
    _fused, tasks = api.partition_model(imported, target)
    keys = [api.workload_key(t) for t in tasks]
    manifest = api.manifest_workloads(ROOT / "data")
    excluded, by_model, by_hash = excluded_workloads(model, keys, manifest)
    params = pretrain_params()
    features = features_path()
    groups = api.training_groups(features, params["machines"])
    in_training = leaked(groups, keys)
    weights, info = cached_weights(layout, groups, excluded, params, features)
    ensemble = None
    if layout.prepares_ensemble():
        ensemble = weights.with_name(f"{weights.stem}-ensemble{MEMBERS}.pt")
        if not ensemble.is_file():
            api.pretrain_ensemble_leaving_out(groups, excluded, params, weights, ensemble, MEMBERS)
    remaining = [g for g in groups if g.name not in excluded]
    overlap = leaked(remaining, excluded)
    assert overlap == 0, f"{model.name}: {overlap} of its workloads are still in the training set"
    assert info["workloads"] == len(remaining), f"{model.name}: cached weights of another set"
    record = {
        "model": model.name,
        "file": str(path),
        "source_sha1": model.source_sha1(),
        "features_sha1": file_sha1(features),
        "lowering": api.default_lowering(),
        "target": config,
        "tasks": [
            {"name": t.name, "kernel_class": t.kernel_class, "weight": t.weight} for t in tasks
        ],  # fmt: skip
        "task_keys": keys,
        "default_per_round": api.default_trials_per_round(len(tasks)),
        "excluded_by_model": by_model,
        "excluded_by_hash_only": by_hash,
        "task_hashes_in_training_before": in_training,
        "leaked_workloads": overlap,
        "weights": str(weights),
        "ensemble": str(ensemble) if ensemble else None,
        "pretraining": info,
    }
    print(
        f"{model.name}: {len(tasks)} tasks; left out {by_model} workloads of the zoo model and "
        f"{by_hash} more by task hash ({in_training} of its task hashes were in the training "
        f"set); overlap after removal: {overlap}",
        flush=True,
    )
    write_json(layout.prepared(model.name), record)
    return record
