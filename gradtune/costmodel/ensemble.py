"""AdaTune's surrogate with uncertainty (§4.2) for Felix's MLP: a deep ensemble.

K Felix MLPs are pretrained on the same dataset, each from its own seed (initial weights and
batch order), and fine-tuned online like the single model (``OnlineCostModel``). Where the
data pins a program down they agree; where it does not, they disagree, and their spread σ is
the uncertainty the acquisition and the contextual exploration share use.

Members score on their own scales: a ranking loss fixes order, not units, so two members' raw
scores cannot be averaged as they are. ``Scale`` puts them on one: each member's scores are
standardized over random programs of the task (mean 0, std 1), so μ and σ read as "standard
deviations away from a random program", the unit the acquisition and Eq. 3 need.

The weights file holds every member's state in float16 (half the bytes in git; the scores move
by ~1e-3 of their spread) and loads them as float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from gradtune.costmodel.model import FelixMLP, pad
from gradtune.costmodel.train import Group
from gradtune.symbolic.features import FEATURES

MEMBERS = 4  # AdaTune's ablation and the floor; each costs a pretraining run (~3 min)
BUNDLED = Path(__file__).parent / "weights"


def bundled_path(target_kind: str = "llvm") -> Path:
    return BUNDLED / f"{target_kind}-ensemble.pt"


def pretrain_members(
    groups: list[Group], members: int, loss: str, epochs: int, lr: float, seed: int
) -> tuple[list[FelixMLP], list[float]]:
    """``members`` Felix MLPs trained on ``groups`` with seeds ``seed``, ``seed + 1``, …;
    (models, each one's final loss)."""
    from gradtune.costmodel.pretrain import train

    models, losses = [], []
    for k in range(members):
        model, history = train(groups, loss, epochs, lr, seed + k)
        models.append(model)
        losses.append(history[-1] if history else float("nan"))
    return models, losses


def save_members(models: list[FelixMLP], path: str | Path) -> None:
    """Write the members whole (a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    states = [{k: v.half() for k, v in m.state_dict().items()} for m in models]
    partial = path.with_suffix(".partial")
    torch.save({"members": states, "input_dim": FEATURES}, partial)
    partial.replace(path)


def load_members(path: str | Path) -> list[FelixMLP]:
    blob = torch.load(path, map_location="cpu", weights_only=True)
    models = []
    for state in blob["members"]:
        model = FelixMLP(blob["input_dim"])
        model.load_state_dict({k: v.float() for k, v in state.items()})
        model.eval()
        models.append(model)
    if len(models) < 2:
        raise ValueError(f"{path}: an ensemble needs two or more members, not {len(models)}")
    return models


def member_scores(models: list[FelixMLP], programs: list[torch.Tensor]) -> torch.Tensor:
    """Every member's raw score of every program, (members, programs); differentiable."""
    features, mask = pad(programs)
    return torch.stack([m(features, mask) for m in models])


@dataclass
class Scale:
    """Per member, the mean and std of its raw scores over a task's random programs."""

    mean: torch.Tensor  # (members,)
    std: torch.Tensor  # (members,)

    @classmethod
    def fit(cls, raw: torch.Tensor) -> Scale:
        """From raw scores (members, programs) of random programs; members whose scores are
        not finite there get NaN and are dropped wherever they are used."""
        raw = raw.detach()
        finite = torch.isfinite(raw).all(1)
        mean = torch.where(finite, raw.nan_to_num().mean(1), torch.nan)
        std = torch.where(finite, raw.nan_to_num().std(1).clamp(min=1e-9), torch.nan)
        return cls(mean, std)

    def mu_sigma(self, raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(μ, σ, dropped) of raw scores (members, programs) on the standardized scale.

        A member's score that is NaN or inf for a program (or a member without a finite
        scale) is left out of that program's μ and σ, and counted in ``dropped``, rather than
        poisoning them. A program no two members score finitely gets μ = NaN, which the
        caller drops like any other non-finite prediction."""
        z = (raw - self.mean[:, None]) / self.std[:, None]
        ok = torch.isfinite(z)
        count = ok.sum(0)
        dropped = int(((~ok) & (count > 0)[None, :]).sum())
        # torch.where, not a product with the mask: a NaN times 0 would still be NaN, in the
        # value and in the gradient.
        zero = torch.zeros_like(z)
        z = torch.where(ok, z, zero)
        n = count.to(z.dtype)
        mu = z.sum(0) / n.clamp(min=1)
        var = torch.where(ok, (z - mu[None, :]) ** 2, zero).sum(0) / (n - 1).clamp(min=1)
        mu = torch.where(count >= 2, mu, torch.full_like(mu, torch.nan))
        return mu, var.clamp(min=1e-12).sqrt(), dropped
