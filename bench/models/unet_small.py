"""Held-out benchmark model: a small UNet-like encoder–decoder for dense prediction.

Not in the cost model's training zoo and not built from it: two encoder stages with max-pool
downsampling, a bottleneck, and two decoder stages that upsample (nearest neighbour), concatenate
the encoder's skip connection and convolve; widths 12/24/48 on a 40×40 input, a 1×1 head with
4 output maps. Random weights, batch 1, float32.

    gradtune tune bench/models/unet_small.py
"""

import torch
from torch import nn


def double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
        nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
    )  # fmt: skip


class UNetSmall(nn.Module):
    def __init__(self, widths: tuple[int, int, int] = (12, 24, 48), classes: int = 4) -> None:
        super().__init__()
        a, b, c = widths
        self.enc1 = double_conv(3, a)
        self.enc2 = double_conv(a, b)
        self.bottleneck = double_conv(b, c)
        self.dec2 = double_conv(c + b, b)
        self.dec1 = double_conv(b + a, a)
        self.head = nn.Conv2d(a, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s1 = self.enc1(x)
        s2 = self.enc2(nn.functional.max_pool2d(s1, 2))
        y = self.bottleneck(nn.functional.max_pool2d(s2, 2))
        y = self.dec2(torch.cat([nn.functional.interpolate(y, scale_factor=2.0), s2], dim=1))
        y = self.dec1(torch.cat([nn.functional.interpolate(y, scale_factor=2.0), s1], dim=1))
        return self.head(y)


def get_model() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return UNetSmall().eval(), (torch.randn(1, 3, 40, 40),)
