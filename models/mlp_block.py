"""A small MLP block (LayerNorm → Linear → GELU → Linear, with a residual): the model
``configs/models.yaml`` lists for ``gradtune retune``, small enough to retune in minutes.

Weights are random but seeded: retune fingerprints the imported graph and its weights, so an
unseeded model would look changed on every run.
"""

import torch
from torch import nn


class MLPBlock(nn.Module):
    def __init__(self, dim: int = 64, hidden: int = 128) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def get_model() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return MLPBlock().eval(), (torch.randn(8, 64),)
