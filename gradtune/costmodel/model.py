"""Felix's cost model (TenSet's MLP): score a program from its per-store features.

Each store's 164 features go through a shared MLP (Linear → 256, ReLU, ×2); the program is
the sum over its stores; two residual blocks and a linear head give one score, higher = faster
(trained on throughput normalized per workload). ~240K parameters. Unlike MetaSchedule's
SegmentSumMLP it takes gradtune's *symbolic* features, so the gradient search can
differentiate the score with respect to the schedule's variables through it.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from gradtune.symbolic.features import FEATURES


class FelixMLP(nn.Module):
    def __init__(self, input_dim: int = FEATURES, hidden: int = 256) -> None:
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Linear(input_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU()
        )
        self.res0 = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU())
        self.res1 = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, 1)

    def forward(self, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """features (batch, stores, 164), mask (batch, stores) of real stores → (batch,)."""
        encoded = self.encoder(features.to(self.head.weight.dtype)) * mask[..., None]
        program = encoded.sum(1)
        program = self.res0(program) + program
        program = self.res1(program) + program
        return self.head(program).squeeze(-1)

    def score(self, programs: list[torch.Tensor]) -> torch.Tensor:
        """Scores of programs given as (stores, 164) tensors of varying store counts."""
        features, mask = pad(programs)
        return self(features, mask)


def pad(programs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack (stores_i, 164) tensors into (batch, max stores, 164) plus a mask; keeps grads."""
    width = max((p.shape[0] for p in programs), default=1) or 1
    rows, masks = [], []
    for p in programs:
        missing = width - p.shape[0]
        if missing:
            p = torch.cat([p, p.new_zeros((missing, p.shape[1]))], 0)
        rows.append(p)
        masks.append(torch.arange(width) < width - missing)
    return torch.stack(rows).to(torch.float32), torch.stack(masks).to(torch.float32)


def save(model: FelixMLP, path: str | Path) -> None:
    torch.save({"state_dict": model.state_dict(), "input_dim": FEATURES}, path)


def load(path: str | Path) -> FelixMLP:
    blob = torch.load(path, map_location="cpu", weights_only=True)
    model = FelixMLP(blob["input_dim"])
    model.load_state_dict(blob["state_dict"])
    model.eval()
    return model
