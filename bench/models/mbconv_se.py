"""Held-out benchmark model: an EfficientNet-style MBConv network with squeeze-and-excitation.

Not in the cost model's training zoo and not built from it: SiLU activations, 5×5 depthwise
kernels, squeeze-and-excitation gates (global pool → two small dense layers → sigmoid scale),
48×48 input and widths 24/40/72/96 that no zoo model uses. Random weights, batch 1, float32.

    gradtune tune bench/models/mbconv_se.py
"""

import torch
from torch import nn


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, squeezed: int) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(channels, squeezed, 1)
        self.expand = nn.Conv2d(squeezed, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = x.mean(dim=(2, 3), keepdim=True)
        return x * torch.sigmoid(self.expand(nn.functional.silu(self.reduce(gate))))


class MBConv(nn.Module):
    """1×1 expand (skipped at ratio 1), k×k depthwise, SE, 1×1 project; residual when shapes
    allow."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers += [nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.SiLU()]
        layers += [
            nn.Conv2d(hidden, hidden, kernel, stride, kernel // 2, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden),
            nn.SiLU(),
            SqueezeExcite(hidden, max(4, cin // 4)),
            nn.Conv2d(hidden, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        ]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.residual else y


class MBConvSE(nn.Module):
    def __init__(self, num_classes: int = 12) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 24, 3, 2, 1, bias=False), nn.BatchNorm2d(24), nn.SiLU()
        )
        self.blocks = nn.Sequential(
            MBConv(24, 24, kernel=3, stride=1, expand=1),
            MBConv(24, 40, kernel=5, stride=2, expand=3),
        )
        self.head = nn.Sequential(nn.Conv2d(40, 96, 1, bias=False), nn.BatchNorm2d(96), nn.SiLU())
        self.fc = nn.Linear(96, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.head(self.blocks(self.stem(x))).mean(dim=(2, 3)))


def get_model() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return MBConvSE().eval(), (torch.randn(1, 3, 48, 48),)
