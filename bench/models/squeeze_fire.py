"""Held-out benchmark model: a SqueezeNet-style CNN, tuned from ONNX.

The shape of the model issue 14 was filed on (a CNN in no file of this repository then):
a 5×5 stride-2 stem convolution over 3 input channels, a 3×3 max-pool, one fire module
(1×1 squeeze, then 1×1 and 3×3 expands concatenated) and a pooled head. Not in the cost
model's training zoo and not built from it: the 5×5 stem, the concatenation and the widths
20/12/56 are in no zoo model. Random weights, batch 1, float32, 64×64 input, ~12 MFLOP.

    gradtune tune bench/models/squeeze_fire.py
"""

from pathlib import Path

import torch
from torch import nn


class Fire(nn.Module):
    def __init__(self, cin: int, squeeze: int, expand: int) -> None:
        super().__init__()
        self.squeeze = nn.Conv2d(cin, squeeze, 1)
        self.expand1 = nn.Conv2d(squeeze, expand, 1)
        self.expand3 = nn.Conv2d(squeeze, expand, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.relu(self.squeeze(x))
        return torch.cat([torch.relu(self.expand1(s)), torch.relu(self.expand3(s))], dim=1)


class SqueezeFire(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 20, 5, stride=2, padding=2)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        self.fire = Fire(20, 12, 56)
        self.head = nn.Conv2d(112, 40, 3, stride=2, padding=1)
        self.fc = nn.Linear(40, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.stem(x)))
        x = torch.relu(self.head(self.fire(x)))
        return self.fc(x.mean(dim=(2, 3)))


def get_model() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return SqueezeFire().eval(), (torch.randn(1, 3, 64, 64),)


def export_onnx(path: Path) -> Path:
    """Write the model as ONNX (opset 17) with static shapes."""
    model, example = get_model()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial.onnx")
    torch.onnx.export(
        model, example, str(partial), input_names=["image"], output_names=["logits"],
        opset_version=17, dynamo=False,
    )  # fmt: skip
    partial.replace(path)
    return path
