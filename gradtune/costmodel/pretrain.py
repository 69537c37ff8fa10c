"""Pretraining gradtune's cost model on a featurized dataset, and registering the result.

``pretrain`` reads the file ``featurize.featurize_dataset`` writes, trains the Felix/TenSet MLP
(``model.FelixMLP``) on every workload in it, and writes the weights the package bundles
(``gradtune/costmodel/weights/<target>.pt``, small enough for git) with a provenance file
beside them; ``register_champion`` makes those weights ``gradtune-costmodel-<target>@champion``
in an MLflow registry. The DVC stage ``pretrain`` and the Prefect flow ``pretrain-cost-model``
both run these functions.

Which machines' records it trains on is chosen by ``machines`` (``dataset.machines.
select_machines``): by default those that measured for the features file's target, refused
when their ISA flags differ; ``all``, or a list of machine ids, when asked. The provenance
names the machines used.
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
from gradtune.dataset.machines import select_machines
from gradtune.errors import GradtuneError


def load_groups(
    features: str | Path, machines: str = "target"
) -> tuple[list[Group], dict[str, Any]]:
    """Training groups of a features file measured by the machines ``machines`` selects
    (``select_machines``: ``target``, ``all`` or ``ID,ID``), and the file's metadata (target,
    counts, ``machines``: the descriptors of the machines kept, by id)."""
    features = Path(features)
    if not features.is_file():
        raise GradtuneError(f"{features} not found: run the featurize stage first (dvc repro)")
    blob = torch.load(features, map_location="cpu", weights_only=False)
    descriptors = blob.get("machines")
    if descriptors is None:
        # Written before records had machines: one unnamed machine, the dataset's.
        if machines not in ("target", "all"):
            raise GradtuneError(
                f"{features} names no machines (featurized before records had them): "
                "featurize again to choose machines"
            )
        descriptors, chosen = {}, None
    else:
        chosen = set(select_machines(descriptors, machines, blob.get("target")))
    groups = [
        Group(w["key"], w["family"], w["programs"], np.asarray(w["latencies"]))
        for w in blob["workloads"]
        if len(w["latencies"]) >= 2 and (chosen is None or w.get("machine") in chosen)
    ]
    if not groups:
        raise GradtuneError(f"{features}: no workload with two or more records")
    meta = {k: v for k, v in blob.items() if k != "workloads"}
    meta["machines"] = {m: d for m, d in descriptors.items() if chosen is None or m in chosen}
    return groups, meta


def pretrain(
    features: str | Path,
    weights: str | Path,
    loss: str = "rank",
    epochs: int = 40,
    lr: float = 7e-4,
    seed: int = 0,
    machines: str = "target",
) -> tuple[dict[str, Any], list[float]]:
    """Train on ``features`` and write ``weights`` with its provenance (``<weights>.json``).

    ``machines`` chooses whose records to train on (``load_groups``). Returns the provenance
    (target, machines, counts, hyperparameters, final loss, seconds, the features file's
    SHA-1, date) and the loss per epoch.
    """
    from rich.progress import Progress

    features, weights = Path(features), Path(weights)
    groups, meta = load_groups(features, machines)
    start = time.perf_counter()
    with Progress(transient=True) as progress:
        bar = progress.add_task(f"pretraining ({loss} loss)", total=epochs)
        model, history = train(groups, loss, epochs, lr, seed, lambda: progress.advance(bar))
    info = {
        "target": meta.get("target"),
        "machines": meta["machines"],
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
    on_epoch: Callable[[int, FelixMLP], None] | None = None,
) -> tuple[FelixMLP, list[float]]:
    """A fresh ``FelixMLP`` seeded with ``seed`` and fitted on ``groups``; (model, loss per
    epoch). Pretraining and leave-out pretraining share it, so they differ only in the data.

    ``on_epoch(epoch, model)`` sees the model after each epoch (1-based). A run of E epochs
    passes through exactly the states of every shorter run with the same seed, so one run
    can stand for several training lengths."""
    torch.manual_seed(seed)
    model = FelixMLP()
    done = 0

    def after_epoch() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress()
        if on_epoch is not None:
            on_epoch(done, model)

    history = fit(model, groups, loss=loss, epochs=epochs, lr=lr, seed=seed, progress=after_epoch)
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
