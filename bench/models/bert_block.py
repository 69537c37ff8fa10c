"""Held-out benchmark model: one BERT-style encoder block, tuned from an ONNX file.

Not in the cost model's training zoo and not built from it: post-norm (LayerNorm after each
residual, as BERT), separate query/key/value projections, exact-erf GELU, width 80 with 5
heads of 16 and a 4× feed-forward (320), sequence 24 — dimensions no zoo transformer uses.
Random weights, batch 1, float32.

gradtune tunes ``.onnx`` files directly; the benchmark writes one with :func:`export_onnx`
(``torch.onnx.export``, the TorchScript exporter) and tunes that file. ``get_model`` is the
same network for ``gradtune tune bench/models/bert_block.py``.
"""

from pathlib import Path

import torch
from torch import nn


class BertBlock(nn.Module):
    def __init__(self, d: int = 80, heads: int = 5, ff: int = 320) -> None:
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(d, d)
        self.key = nn.Linear(d, d)
        self.value = nn.Linear(d, d)
        self.out = nn.Linear(d, d)
        self.norm1 = nn.LayerNorm(d, eps=1e-12)
        self.inter = nn.Linear(d, ff)
        self.output = nn.Linear(ff, d)
        self.norm2 = nn.LayerNorm(d, eps=1e-12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        head = d // self.heads

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(b, s, self.heads, head).transpose(1, 2)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        att = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) / head**0.5, dim=-1)
        ctx = torch.matmul(att, v).transpose(1, 2).reshape(b, s, d)
        x = self.norm1(x + self.out(ctx))
        return self.norm2(x + self.output(nn.functional.gelu(self.inter(x))))


def get_model() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return BertBlock().eval(), (torch.randn(1, 24, 80),)


def export_onnx(path: Path) -> Path:
    """Write the block as ONNX (opset 17: LayerNormalization is one op) with static shapes."""
    model, example = get_model()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial.onnx")
    torch.onnx.export(
        model, example, str(partial), input_names=["hidden"], output_names=["out"],
        opset_version=17, dynamo=False,
    )  # fmt: skip
    partial.replace(path)
    return path
