"""Pretraining gradtune's cost model on a featurized dataset, and registering the result.

``pretrain`` reads the file ``featurize.featurize_dataset`` writes, trains the Felix/TenSet MLP
(``model.FelixMLP``) on every workload in it, and writes the weights the package bundles
(``gradtune/costmodel/weights/<target>.pt``, small enough for git) with a provenance file
beside them; ``register_champion`` makes those weights ``gradtune-costmodel-<target>@champion``
in an MLflow registry. The DVC stage ``pretrain`` and the Prefect flow ``pretrain-cost-model``
both run these functions.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gradtune.costmodel import champion
from gradtune.costmodel.model import FelixMLP, save
from gradtune.costmodel.train import Group, fit
from gradtune.errors import GradtuneError


def load_groups(features: str | Path) -> tuple[list[Group], dict[str, Any]]:
    """Training groups of a features file, and the file's metadata (target, counts)."""
    features = Path(features)
    if not features.is_file():
        raise GradtuneError(f"{features} not found: run the featurize stage first (dvc repro)")
    blob = torch.load(features, map_location="cpu", weights_only=False)
    groups = [
        Group(w["key"], w["family"], w["programs"], np.asarray(w["latencies"]))
        for w in blob["workloads"]
        if len(w["latencies"]) >= 2
    ]
    if not groups:
        raise GradtuneError(f"{features}: no workload with two or more records")
    return groups, {k: v for k, v in blob.items() if k != "workloads"}


def pretrain(
    features: str | Path,
    weights: str | Path,
    loss: str = "rank",
    epochs: int = 40,
    lr: float = 7e-4,
    seed: int = 0,
) -> tuple[dict[str, Any], list[float]]:
    """Train on ``features`` and write ``weights`` with its provenance (``<weights>.json``).

    Returns the provenance (target, counts, hyperparameters, final loss, seconds, the features
    file's SHA-1, date) and the loss per epoch.
    """
    from rich.progress import Progress

    features, weights = Path(features), Path(weights)
    groups, meta = load_groups(features)
    start = time.perf_counter()
    with Progress(transient=True) as progress:
        bar = progress.add_task(f"pretraining ({loss} loss)", total=epochs)
        model, history = train(groups, loss, epochs, lr, seed, lambda: progress.advance(bar))
    info = {
        "target": meta.get("target"),
        "workloads": len(groups),
        "records": int(sum(len(g.latencies) for g in groups)),
        "families": sorted({g.family for g in groups}),
        "loss": loss,
        "epochs": epochs,
        "lr": lr,
        "seed": seed,
        "final_loss": round(history[-1], 5),
        "train_seconds": round(time.perf_counter() - start, 1),
        "features_sha1": hashlib.sha1(features.read_bytes()).hexdigest(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    write_weights(model, weights)
    weights.with_suffix(".json").write_text(json.dumps(info, indent=2) + "\n")
    return info, history


def train(
    groups: list[Group],
    loss: str,
    epochs: int,
    lr: float,
    seed: int,
    progress: Callable[[], None] | None = None,
) -> tuple[FelixMLP, list[float]]:
    """A fresh ``FelixMLP`` seeded with ``seed`` and fitted on ``groups``; (model, loss per
    epoch). Pretraining and leave-out pretraining share it, so they differ only in the data."""
    torch.manual_seed(seed)
    model = FelixMLP()
    history = fit(model, groups, loss=loss, epochs=epochs, lr=lr, seed=seed, progress=progress)
    return model, history


def write_weights(model: FelixMLP, weights: str | Path) -> None:
    """Save ``model`` to ``weights`` whole: a reader never sees half a file."""
    weights = Path(weights)
    weights.parent.mkdir(parents=True, exist_ok=True)
    partial = weights.with_suffix(".partial")
    save(model, partial)
    partial.replace(weights)


def register_champion(
    weights: str | Path, tracking_uri: str, params: dict[str, Any], history: list[float]
) -> dict[str, str]:
    """Log a pretraining run with ``params`` and the loss per epoch, register ``weights`` as
    ``gradtune-costmodel-<target>@champion``; returns run id, version and that reference."""
    weights = Path(weights)
    info = champion.describe(weights)
    kind = (info.get("target") or {}).get("kind", "llvm")
    metrics = {"final_loss": history[-1], "records": info.get("records", 0)}
    return champion.register(weights, tracking_uri, kind, params, history, metrics)
