"""Pretraining the cost model with some workloads left out, to test on what it never saw.

A benchmark that tunes a model whose kernels were in the pretraining data measures memory, not
search: the cost model has already ranked those very programs. So the workloads to leave out
are named by structural hash (the dataset's workload key, also the JSONDatabase's), and the
training is otherwise exactly the ``pretrain`` stage's: same loss, epochs, learning rate and
seed, a fresh ``FelixMLP`` seeded the same way.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gradtune.costmodel.model import FelixMLP
from gradtune.costmodel.pretrain import train
from gradtune.costmodel.train import Group


def workloads_of_models(manifest_workloads: dict[str, Any], models: Iterable[str]) -> set[str]:
    """Keys of every workload the dataset's manifest attributes to any of ``models`` (at any
    batch size: the manifest lists a workload's models, not its instances, for that)."""
    wanted = set(models)
    return {key for key, entry in manifest_workloads.items() if wanted & set(entry["models"])}


def leaked(groups: list[Group], keys: Iterable[str]) -> int:
    """How many training groups are workloads in ``keys``: 0 is the point of leaving out."""
    keys = set(keys)
    return sum(g.name in keys for g in groups)


def pretrain_leaving_out(
    groups: list[Group], excluded: set[str], loss: str, epochs: int, lr: float, seed: int
) -> tuple[FelixMLP, dict[str, Any]]:
    """Train on every group whose workload key is not in ``excluded``; (model, what was used).

    Group names are workload keys, as ``costmodel_training.featurize`` writes them."""
    kept = [g for g in groups if g.name not in excluded]
    model, history = train(kept, loss, epochs, lr, seed)
    info = {
        "workloads": len(kept),
        "left_out": len(groups) - len(kept),
        "records": int(sum(len(g.latencies) for g in kept)),
        "loss": loss,
        "epochs": epochs,
        "lr": lr,
        "seed": seed,
        "final_loss": round(history[-1], 5) if history else None,
    }
    return model, info
