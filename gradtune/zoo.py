"""The model zoo: small networks built in code with random weights, covering the operator
families Felix evaluates on (2D / depthwise / 3D / transposed convolution, dense, batch matmul,
softmax, layer and RMS norm).

Every builder is ``(batch) -> (nn.Module in eval mode, tuple of example inputs)`` and is sized
to tune on two cores: the dataset collection measures >= 128 candidates of every
distinct workload, and the benchmark set reuses the same builders. ``configs/zoo.yaml`` says
which models and batch sizes the dataset covers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .errors import GradtuneError

Builder = Callable[[int], tuple[nn.Module, tuple[torch.Tensor, ...]]]


# --------------------------------------------------------------------------- ResNet-18-like


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.skip: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.skip = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.skip(x) + self.bn2(self.conv2(y)))


class ResNetLike(nn.Module):
    def __init__(self, widths: tuple[int, ...] = (16, 32, 64), num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()
        )
        blocks, cin = [], widths[0]
        for i, w in enumerate(widths):
            blocks.append(BasicBlock(cin, w, 1 if i == 0 else 2))
            cin = w
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.blocks(self.stem(x)).mean(dim=(2, 3)))


def resnet18_like(batch: int = 1) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Basic blocks with BN and residuals, three stride-2 stages, 32×32 input, widths 16–64."""
    torch.manual_seed(0)
    return ResNetLike().eval(), (torch.randn(batch, 3, 32, 32),)


# --------------------------------------------------------------------------- MobileNetV2-like


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


def mobilenetv2_like(batch: int = 1) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Inverted residuals (1×1 expand, 3×3 depthwise, 1×1 project, ReLU6), 32×32 input."""
    torch.manual_seed(0)
    return MobileNetV2Like().eval(), (torch.randn(batch, 3, 32, 32),)


# --------------------------------------------------------------------------- R3D-like


class R3DLike(nn.Module):
    """3D convolutions over a short clip: stem, one residual block, a stride-2 stage."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv3d(3, 8, (3, 3, 3), 1, 1, bias=False), nn.BatchNorm3d(8), nn.ReLU()
        )
        self.conv1 = nn.Conv3d(8, 8, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm3d(8)
        self.down = nn.Sequential(
            nn.Conv3d(8, 16, 3, 2, 1, bias=False), nn.BatchNorm3d(16), nn.ReLU()
        )
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = torch.relu(x + self.bn1(self.conv1(x)))
        return self.fc(self.down(x).mean(dim=(2, 3, 4)))


def r3d_like(batch: int = 1) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """3D-conv video classifier on 8 frames of 16×16."""
    torch.manual_seed(0)
    return R3DLike().eval(), (torch.randn(batch, 3, 8, 16, 16),)


# --------------------------------------------------------------------------- DCGAN-like


def dcgan_like(batch: int = 1) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Generator: transposed convolutions 1×1 → 4×4 → 8×8 → 16×16 → 32×32, BN, ReLU, Tanh."""
    torch.manual_seed(0)
    generator = nn.Sequential(
        nn.ConvTranspose2d(32, 64, 4, 1, 0, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
        nn.ConvTranspose2d(64, 32, 4, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        nn.ConvTranspose2d(32, 16, 4, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        nn.ConvTranspose2d(16, 3, 4, 2, 1, bias=False), nn.Tanh(),
    )  # fmt: skip
    return generator.eval(), (torch.randn(batch, 32, 1, 1),)


# --------------------------------------------------------------------------- Transformers


class EncoderLayer(nn.Module):
    """Pre-norm self-attention (batch matmuls, softmax) + GELU MLP, LayerNorm."""

    def __init__(self, d: int = 64, heads: int = 4, ff: int = 128) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm1 = nn.LayerNorm(d)
        self.norm2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, ff), nn.GELU(), nn.Linear(ff, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = (
            self.qkv(self.norm1(x))
            .reshape(b, s, 3, self.heads, d // self.heads)
            .permute(2, 0, 3, 1, 4)
        )
        att = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(self.norm2(x))


def transformer_encoder(batch: int = 1) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """One encoder layer: sequence 32, width 64, 4 heads."""
    torch.manual_seed(0)
    return EncoderLayer().eval(), (torch.randn(batch, 32, 64),)


class ViTLike(nn.Module):
    """Patch embedding (strided conv), class token, encoder layers, LayerNorm + linear head."""

    def __init__(self, d: int = 96, heads: int = 4, depth: int = 1, patch: int = 4) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, d, patch, patch)
        self.cls = nn.Parameter(torch.randn(1, 1, d) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, (32 // patch) ** 2 + 1, d) * 0.02)
        self.layers = nn.Sequential(*[EncoderLayer(d, heads, 2 * d) for _ in range(depth)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(x).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.cls.expand(x.shape[0], -1, -1), tokens], dim=1) + self.pos
        return self.head(self.norm(self.layers(tokens))[:, 0])


def vit_like(batch: int = 1) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """ViT on 32×32 images, 4×4 patches (65 tokens), width 96, 4 heads."""
    torch.manual_seed(0)
    return ViTLike().eval(), (torch.randn(batch, 3, 32, 32),)


class RMSNorm(nn.Module):
    # Written out rather than nn.RMSNorm so the exported graph is plain elementwise ops and a
    # mean, which every frontend imports.
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class LlamaBlock(nn.Module):
    """A LLaMA decoder block: RMSNorm, causal attention (batch matmul + softmax), SwiGLU MLP."""

    def __init__(self, d: int = 128, heads: int = 4, ff: int = 256, seq: int = 32) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = RMSNorm(d)
        self.norm2 = RMSNorm(d)
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, d, bias=False)
        self.v = nn.Linear(d, d, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.gate = nn.Linear(d, ff, bias=False)
        self.up = nn.Linear(d, ff, bias=False)
        self.down = nn.Linear(ff, d, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), -1e4), diagonal=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        h = self.norm1(x)

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2)

        q, k, v = split(self.q(h)), split(self.k(h)), split(self.v(h))
        scores = q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5 + self.mask[:s, :s]
        att = torch.softmax(scores, dim=-1) @ v
        x = x + self.o(att.transpose(1, 2).reshape(b, s, d))
        h = self.norm2(x)
        return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))


def llama_block(batch: int = 1) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """One decoder block: sequence 32, width 128, 4 heads, SwiGLU width 256."""
    torch.manual_seed(0)
    return LlamaBlock().eval(), (torch.randn(batch, 32, 128),)


BUILDERS: dict[str, Builder] = {
    "resnet18_like": resnet18_like,
    "mobilenetv2_like": mobilenetv2_like,
    "r3d_like": r3d_like,
    "dcgan_like": dcgan_like,
    "vit_like": vit_like,
    "llama_block": llama_block,
    "transformer_encoder": transformer_encoder,
}


# --------------------------------------------------------------------------- config + import


@dataclass
class ZooEntry:
    model: str
    batches: list[int] = field(default_factory=lambda: [1])


def load_config(path: str | Path) -> list[ZooEntry]:
    """``configs/zoo.yaml`` → entries; unknown model names or bad batches are one-line errors."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise GradtuneError(f"zoo config not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise GradtuneError(f"{path} is not valid YAML: {err}") from None
    models = raw.get("models") if isinstance(raw, dict) else None
    if not isinstance(models, list) or not models:
        raise GradtuneError(f"{path}: expected a non-empty list under 'models:'")
    entries = []
    for item in models:
        name = item.get("name") if isinstance(item, dict) else None
        if name not in BUILDERS:
            raise GradtuneError(
                f"{path}: unknown model {name!r}; the zoo has {', '.join(sorted(BUILDERS))}"
            )
        batches = item.get("batches", [1])
        if not isinstance(batches, list) or not all(isinstance(b, int) and b > 0 for b in batches):
            raise GradtuneError(f"{path}: {name}: batches must be a list of positive integers")
        entries.append(ZooEntry(name, batches))
    return entries


def import_model(name: str, batch: int) -> tuple[Any, dict[str, Any]]:
    """Build ``name`` at ``batch`` and import it into Relax: (IRModule, params by name)."""
    from tvm import relax
    from tvm.relax.frontend.torch import from_exported_program

    from .frontend import named_params

    if name not in BUILDERS:
        raise GradtuneError(
            f"unknown zoo model {name!r}; the zoo has {', '.join(sorted(BUILDERS))}"
        )
    model, example = BUILDERS[name](batch)
    with torch.no_grad():
        exported = torch.export.export(model, example)
    mod = from_exported_program(exported, keep_params_as_input=True)
    mod, params = relax.frontend.detach_params(mod)
    return mod, named_params(mod, params.get("main", []))


def model_tag(name: str, batch: int) -> str:
    return f"{name}@b{batch}"
