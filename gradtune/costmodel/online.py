"""The cost model a tuning session uses: pretrained weights, fine-tuned on what it measures.

Weights come from, in order: an explicit path; the registered champion
(``gradtune-costmodel-<target>@champion``) when an MLflow tracking URI is configured; the copy
bundled with the package (``gradtune/costmodel/weights/<target>.pt``, written by
``costmodel_training.pretrain``); otherwise a fresh initialization (logged: the first rounds
then explore blindly until measurements arrive).
After every measured batch the model is fine-tuned for a few passes over this session's
measurements (ranking loss within each task), which is what keeps the descent honest: it
exploits the model's errors, and measuring its favourites corrects them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from gradtune.costmodel import model as mlp
from gradtune.costmodel.train import Group, fit

log = logging.getLogger("gradtune.costmodel")
BUNDLED = Path(__file__).parent / "weights"


def bundled_path(target_kind: str = "llvm") -> Path:
    return BUNDLED / f"{target_kind}.pt"


def load_pretrained(
    target_kind: str = "llvm", path: str | Path | None = None, tracking_uri: str | None = None
) -> tuple:
    """(model, where it came from)."""
    if path is not None:
        return mlp.load(path), str(path)
    if tracking_uri:
        import tempfile

        from gradtune.costmodel.champion import download_champion
        from gradtune.errors import GradtuneError

        try:
            with tempfile.TemporaryDirectory(prefix="gradtune-champion-") as tmp:
                weights = download_champion(tracking_uri, target_kind, Path(tmp))
                model = mlp.load(weights)
            source = f"models:/gradtune-costmodel-{target_kind}@champion ({tracking_uri})"
            log.info("cost model: %s", source)
            return model, source
        except GradtuneError as err:
            # A registry without a champion yet is normal before the first pretraining run.
            log.warning("%s; using the bundled cost model", err)
    if bundled_path(target_kind).is_file():
        return mlp.load(bundled_path(target_kind)), str(bundled_path(target_kind))
    log.warning("no pretrained cost model for %s: starting from random weights", target_kind)
    torch.manual_seed(0)
    return mlp.FelixMLP(), "random init"


@dataclass
class OnlineCostModel:
    model: mlp.FelixMLP
    source: str = "random init"
    epochs: int = 4
    data: dict[str, tuple[list[torch.Tensor], list[float]]] = field(default_factory=dict)
    losses: list[float] = field(default_factory=list)

    @classmethod
    def default(
        cls,
        target_kind: str = "llvm",
        path: str | Path | None = None,
        tracking_uri: str | None = None,
    ) -> OnlineCostModel:
        model, source = load_pretrained(target_kind, path, tracking_uri)
        return cls(model=model, source=source)

    def observe(self, task: str, programs: list[torch.Tensor], latencies: list[float]) -> float:
        """Add a task's measurements and fine-tune; returns the last epoch's loss."""
        if programs:
            seen = self.data.setdefault(task, ([], []))
            seen[0].extend(programs)
            seen[1].extend(latencies)
        groups = [
            Group(name, name, p, np.asarray(lat))
            for name, (p, lat) in self.data.items()
            if len(lat) >= 2
        ]
        if not groups:
            return float("nan")
        history = fit(self.model, groups, loss="rank", epochs=self.epochs, lr=3e-4)
        self.losses.append(history[-1])
        return history[-1]
