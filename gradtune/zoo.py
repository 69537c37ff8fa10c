"""The model zoo: small networks built in code with random weights, covering the operator
families Felix evaluates on (2D / depthwise / 3D / transposed convolution, dense, batch matmul,
softmax, layer and RMS norm) and, within each, the shapes a cost model has to tell apart:
grouped and dilated convolutions of several strides and kernel sizes, 1×1 convolutions, max
and average pooling, attention over windows, long sequences and another sequence's memory
with head widths 16 to 32, dense layers over tokens, channels and pixels, and a decoder that
upsamples by transposed convolution and by bilinear interpolation.

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


# --------------------------------------------------------------------------- grouped / dilated


class ResNeXtBlock(nn.Module):
    """1×1 reduce, 3×3 grouped convolution (cardinality ``groups``), 1×1 expand, residual."""

    def __init__(self, cin: int, width: int, cout: int, stride: int, groups: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, width, 3, stride, 1, groups=groups, bias=False),
            nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout),
        )  # fmt: skip
        self.skip: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.skip = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.skip(x) + self.body(x))


def resnext_like(batch: int = 1) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Stem, 3×3 stride-2 max pool, grouped bottlenecks (8 and 16 groups, stride 1 and 2),
    global average pool; 48×48 input."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
        ResNeXtBlock(32, 64, 64, 1, groups=8),
        ResNeXtBlock(64, 128, 128, 2, groups=16),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10),
    )  # fmt: skip
    return model.eval(), (torch.randn(batch, 3, 48, 48),)


class DeepLabLike(nn.Module):
    """MobileNetV1 depthwise-separable backbone (3×3 stride 2, 5×5, 3×3 dilated 2) and an
    ASPP head: 1×1, 3×3 dilated 2 and 4, image pooling; bilinear upsampling to the input."""

    def __init__(self, classes: int = 6) -> None:
        super().__init__()

        def separable(cin: int, cout: int, k: int, stride: int, dilation: int) -> nn.Sequential:
            pad = dilation * (k - 1) // 2
            return nn.Sequential(
                nn.Conv2d(cin, cin, k, stride, pad, dilation, groups=cin, bias=False),
                nn.BatchNorm2d(cin), nn.ReLU(),
                nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
            )  # fmt: skip

        self.backbone = nn.Sequential(
            nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            separable(16, 32, 3, 2, 1), separable(32, 48, 5, 1, 1), separable(48, 64, 3, 1, 2),
        )  # fmt: skip
        self.branches = nn.ModuleList(
            [nn.Conv2d(64, 32, 1, bias=False)]
            + [nn.Conv2d(64, 32, 3, 1, d, d, bias=False) for d in (2, 4)]
        )
        self.pooled = nn.Conv2d(64, 32, 1, bias=False)
        self.project = nn.Sequential(
            nn.Conv2d(128, 32, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU()
        )
        self.classify = nn.Conv2d(32, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        y = self.backbone(x)
        pooled = self.pooled(y.mean(dim=(2, 3), keepdim=True)).expand(-1, -1, *y.shape[-2:])
        y = self.project(torch.cat([b(y) for b in self.branches] + [pooled], dim=1))
        return nn.functional.interpolate(
            self.classify(y), size=(h, w), mode="bilinear", align_corners=False
        )


def deeplab_like(batch: int = 1) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Segmentation on 48×48: depthwise (strided, 5×5, dilated) and dilated convolutions."""
    torch.manual_seed(0)
    return DeepLabLike().eval(), (torch.randn(batch, 3, 48, 48),)


class ConvNeXtBlock(nn.Module):
    """7×7 depthwise convolution, LayerNorm over channels (NHWC), 4× dense expansion, GELU."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.dw = nn.Conv2d(d, d, 7, 1, 3, groups=d)
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(self.dw(x).permute(0, 2, 3, 1))
        y = self.down(nn.functional.gelu(self.up(y))).permute(0, 3, 1, 2)
        return x + y


class ConvNeXtLike(nn.Module):
    """4×4 patchify stem, ConvNeXt blocks at widths 32 and 64, LayerNorm + 2×2 stride-2
    downsampling between them, global average pool, LayerNorm, head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 4, 4)
        self.stage1 = ConvNeXtBlock(32)
        self.down_norm = nn.LayerNorm(32)
        self.down = nn.Conv2d(32, 64, 2, 2)
        self.stage2 = ConvNeXtBlock(64)
        self.norm = nn.LayerNorm(64)
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stage1(self.stem(x))
        x = self.down(self.down_norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2))
        return self.head(self.norm(self.stage2(x).mean(dim=(2, 3))))


def convnext_like(batch: int = 1) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """ConvNeXt on 64×64 images: 7×7 depthwise, channel LayerNorm, dense over pixels."""
    torch.manual_seed(0)
    return ConvNeXtLike().eval(), (torch.randn(batch, 3, 64, 64),)


# --------------------------------------------------------------------------- decoder


class UNetDecoderLike(nn.Module):
    """Encoder of strided convolutions and a 2×2 average pool; decoder upsampling once by a
    2×2 stride-2 transposed convolution and once by bilinear interpolation, each followed by
    concatenating the skip and a 3×3 convolution; 1×1 head."""

    def __init__(self, classes: int = 3) -> None:
        super().__init__()

        def conv(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()
            )

        self.enc1 = conv(3, 16)
        self.enc2 = conv(16, 32, stride=2)
        self.bottleneck = conv(32, 64)
        self.up2 = nn.ConvTranspose2d(64, 32, 2, 2)
        self.dec2 = conv(64, 32)
        self.dec1 = conv(32 + 16, 16)
        self.head = nn.Conv2d(16, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s1 = self.enc1(x)  # 32×32
        s2 = self.enc2(s1)  # 16×16
        y = self.bottleneck(nn.functional.avg_pool2d(s2, 2))  # 8×8
        y = self.dec2(torch.cat([self.up2(y), s2], dim=1))  # 16×16
        y = nn.functional.interpolate(y, scale_factor=2.0, mode="bilinear", align_corners=False)
        return self.head(self.dec1(torch.cat([y, s1], dim=1)))


def unet_decoder_like(batch: int = 1) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Dense prediction on 32×32: transposed-conv and bilinear upsampling, skip concatenation."""
    torch.manual_seed(0)
    return UNetDecoderLike().eval(), (torch.randn(batch, 3, 32, 32),)


# --------------------------------------------------------------------------- attention / dense


class WindowAttentionBlock(nn.Module):
    """Swin-style: attention within 7×7 windows (49 tokens, head width 16), LayerNorm, 4× MLP,
    then patch merging (2×2 neighbours concatenated, LayerNorm, dense 4d → 2d)."""

    def __init__(self, d: int = 48, heads: int = 3, window: int = 7) -> None:
        super().__init__()
        self.heads, self.window = heads, window
        self.norm1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.merge_norm = nn.LayerNorm(4 * d)
        self.merge = nn.Linear(4 * d, 2 * d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, h, w, d = x.shape
        n, k = self.window, d // self.heads
        windows = (
            self.norm1(x).reshape(b, h // n, n, w // n, n, d).permute(0, 1, 3, 2, 4, 5)
            .reshape(-1, n * n, d)
        )  # fmt: skip
        q, kk, v = self.qkv(windows).reshape(-1, n * n, 3, self.heads, k).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ kk.transpose(-1, -2) / k**0.5, dim=-1) @ v
        att = self.proj(att.transpose(1, 2).reshape(-1, n * n, d))
        att = att.reshape(b, h // n, w // n, n, n, d).permute(0, 1, 3, 2, 4, 5).reshape(b, h, w, d)
        x = x + att
        x = x + self.mlp(self.norm2(x))
        merged = torch.cat(
            [x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], dim=-1
        )
        return self.merge(self.merge_norm(merged))


class SwinLike(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, 48, 4, 4)
        self.block = WindowAttentionBlock()
        self.head = nn.Linear(96, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(x).permute(0, 2, 3, 1)  # 14×14 tokens
        return self.head(self.block(tokens).mean(dim=(1, 2)))


def swin_like(batch: int = 1) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Window attention on 56×56 images (14×14 tokens, four 7×7 windows), patch merging."""
    torch.manual_seed(0)
    return SwinLike().eval(), (torch.randn(batch, 3, 56, 56),)


class CrossAttentionDecoder(nn.Module):
    """Post-norm Transformer decoder layer: causal self-attention over 20 target tokens,
    attention to 72 memory tokens (head width 32), ReLU MLP; queries and keys differ in
    length, so the batch matmuls are not square."""

    def __init__(self, d: int = 96, heads: int = 3, ff: int = 256, seq: int = 20) -> None:
        super().__init__()
        self.heads = heads
        self.self_qkv = nn.Linear(d, 3 * d)
        self.self_out = nn.Linear(d, d)
        self.cross_q = nn.Linear(d, d)
        self.cross_kv = nn.Linear(d, 2 * d)
        self.cross_out = nn.Linear(d, d)
        self.norms = nn.ModuleList([nn.LayerNorm(d) for _ in range(3)])
        self.mlp = nn.Sequential(nn.Linear(d, ff), nn.ReLU(), nn.Linear(ff, d))
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), -1e4), diagonal=1))

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        b, s, d = t.shape
        return t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2)

    def _attend(self, q, k, v, mask=None) -> torch.Tensor:
        scores = (
            self._heads(q) @ self._heads(k).transpose(-1, -2) / (q.shape[-1] // self.heads) ** 0.5
        )
        if mask is not None:
            scores = scores + mask
        out = torch.softmax(scores, dim=-1) @ self._heads(v)
        return out.transpose(1, 2).reshape(q.shape)

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        s = x.shape[1]
        q, k, v = self.self_qkv(x).chunk(3, dim=-1)
        x = self.norms[0](x + self.self_out(self._attend(q, k, v, self.mask[:s, :s])))
        k, v = self.cross_kv(memory).chunk(2, dim=-1)
        x = self.norms[1](x + self.cross_out(self._attend(self.cross_q(x), k, v)))
        return self.norms[2](x + self.mlp(x))


def cross_attention_decoder(batch: int = 1) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """One decoder layer: 20 target tokens attend to themselves (causal) and to 72 memory
    tokens; width 96, 3 heads."""
    torch.manual_seed(0)
    return CrossAttentionDecoder().eval(), (torch.randn(batch, 20, 96), torch.randn(batch, 72, 96))


class AudioEncoder(nn.Module):
    """A speech-style encoder: 40 mel bins per frame projected to width 64, then a long
    sequence (128 frames) through one encoder layer with 2 heads of width 32."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(40, 64)
        self.layer = EncoderLayer(d=64, heads=2, ff=256)
        self.head = nn.Linear(64, 12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layer(self.embed(x)).mean(dim=1))


def audio_encoder(batch: int = 1) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """128 frames × 40 mel bins: attention over a long sequence."""
    torch.manual_seed(0)
    return AudioEncoder().eval(), (torch.randn(batch, 128, 40),)


class MixerBlock(nn.Module):
    """MLP-Mixer: dense across tokens (on the transposed activations), then across channels."""

    def __init__(self, tokens: int, d: int, token_hidden: int, channel_hidden: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d)
        self.token_mlp = nn.Sequential(
            nn.Linear(tokens, token_hidden), nn.GELU(), nn.Linear(token_hidden, tokens)
        )
        self.norm2 = nn.LayerNorm(d)
        self.channel_mlp = nn.Sequential(
            nn.Linear(d, channel_hidden), nn.GELU(), nn.Linear(channel_hidden, d)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class MLPMixerLike(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, 96, 4, 4)
        self.block = MixerBlock(64, 96, 128, 384)
        self.norm = nn.LayerNorm(96)
        self.head = nn.Linear(96, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(x).flatten(2).transpose(1, 2)
        return self.head(self.norm(self.block(tokens)).mean(dim=1))


def mlp_mixer_like(batch: int = 1) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """32×32 images in 4×4 patches (64 tokens, width 96): token MLP 64→128→64, channel MLP
    96→384→96, a 10-way dense head."""
    torch.manual_seed(0)
    return MLPMixerLike().eval(), (torch.randn(batch, 3, 32, 32),)


BUILDERS: dict[str, Builder] = {
    "resnet18_like": resnet18_like,
    "mobilenetv2_like": mobilenetv2_like,
    "r3d_like": r3d_like,
    "dcgan_like": dcgan_like,
    "vit_like": vit_like,
    "llama_block": llama_block,
    "transformer_encoder": transformer_encoder,
    "resnext_like": resnext_like,
    "deeplab_like": deeplab_like,
    "convnext_like": convnext_like,
    "unet_decoder_like": unet_decoder_like,
    "swin_like": swin_like,
    "cross_attention_decoder": cross_attention_decoder,
    "audio_encoder": audio_encoder,
    "mlp_mixer_like": mlp_mixer_like,
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
