"""The example model the README tunes: a small ResNet-style CNN with random weights.

gradtune loads a Python model file by calling a function (``--entry``, default ``get_model``)
that returns ``(torch.nn.Module, example_inputs)``.
"""

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(y)))


class SmallCNN(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU()
        )
        self.block = Block(16)
        self.down = nn.Sequential(
            nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU()
        )
        self.head = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.down(self.block(self.stem(x)))
        return self.head(x.mean(dim=(2, 3)))


def get_model() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return SmallCNN().eval(), (torch.randn(1, 3, 32, 32),)


def tiny_mlp() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """A two-layer MLP: the fastest model that still gives real tuning tasks (tests use it)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 16))
    return model.eval(), (torch.randn(4, 64),)


def tiny_mlp_wide() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """``tiny_mlp``'s kernel classes at other shapes: what its schedules transfer to (tests)."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(96, 200), nn.ReLU(), nn.Linear(200, 24))
    return model.eval(), (torch.randn(6, 96),)
