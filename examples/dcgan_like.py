"""A DCGAN-like generator: transposed convolutions 1×1 → 4×4 → 8×8 → 16×16 → 32×32 with BN
and ReLU, Tanh output (widths 64–16). Random weights."""

import torch
from torch import nn


def get_model(batch: int = 1):
    torch.manual_seed(0)
    generator = nn.Sequential(
        nn.ConvTranspose2d(32, 64, 4, 1, 0, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
        nn.ConvTranspose2d(64, 32, 4, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        nn.ConvTranspose2d(32, 16, 4, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        nn.ConvTranspose2d(16, 3, 4, 2, 1, bias=False), nn.Tanh(),
    )  # fmt: skip
    return generator.eval(), (torch.randn(batch, 32, 1, 1),)
