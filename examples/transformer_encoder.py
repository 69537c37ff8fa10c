"""A small Transformer encoder layer (multi-head self-attention with batch matmuls and
softmax, LayerNorm, GELU MLP): sequence 32, model width 64, 4 heads. Random weights."""

import torch
from torch import nn


class EncoderLayer(nn.Module):
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


def get_model(batch: int = 1):
    torch.manual_seed(0)
    return EncoderLayer().eval(), (torch.randn(batch, 32, 64),)
