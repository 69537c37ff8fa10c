"""A MobileNetV2-like CNN (inverted residuals: 1×1 expand, 3×3 depthwise, 1×1 project,
ReLU6), sized for 32×32 inputs so that it tunes in minutes on two cores. Random weights."""

import torch
from torch import nn


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int = 4) -> None:
        super().__init__()
        hidden = cin * expand
        self.use_skip = stride == 1 and cin == cout
        self.body = nn.Sequential(
            nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.use_skip else y


class MobileNetV2Like(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6()
        )
        self.blocks = nn.Sequential(
            InvertedResidual(16, 16, 1), InvertedResidual(16, 24, 2), InvertedResidual(24, 32, 2)
        )
        self.head = nn.Sequential(nn.Conv2d(32, 64, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU6())
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.head(self.blocks(self.stem(x))).mean(dim=(2, 3)))


def get_model(batch: int = 1):
    torch.manual_seed(0)
    return MobileNetV2Like().eval(), (torch.randn(batch, 3, 32, 32),)
