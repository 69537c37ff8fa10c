"""Training and ranking metrics for the cost model.

Data comes as *groups*: the measured candidates of one workload, each a (stores, 164)
feature tensor and a latency. Labels are throughput normalized per workload (best = 1), as in
TenSet/Felix, because latencies of different workloads are not comparable. Two losses:
``mse`` on the normalized throughput and ``rank``, a pairwise logistic (RankNet) loss within a
workload: only the order inside a workload matters to a search that picks the best candidates.
``rank_top`` weighs each pair by its faster program's throughput, squared (an ablation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from gradtune.costmodel.model import FelixMLP, pad

# ``rank_top``: the pairwise loss weighted toward the fastest programs (``_group_loss``).
LOSSES = ("rank", "mse", "rank_top")


@dataclass
class Group:
    name: str  # workload
    family: str  # operator family (kernel class) for per-family metrics
    programs: list[torch.Tensor]
    latencies: np.ndarray  # seconds

    @property
    def labels(self) -> np.ndarray:
        return float(self.latencies.min()) / self.latencies


def _group_loss(model: FelixMLP, features, mask, labels: torch.Tensor, loss: str) -> torch.Tensor:
    scores = model(features, mask)
    if loss == "mse":
        return torch.mean((scores - labels) ** 2)
    diff = scores[:, None] - scores[None, :]
    better = (labels[:, None] > labels[None, :] * 1.01).to(scores.dtype)  # 1% noise margin
    if loss == "rank_top":
        # Each pair weighs as the square of its faster program's normalized throughput: a
        # search late in a run ranks programs near the best, where the plain pairwise loss
        # spends little of its weight (a random program is ~4x the best's latency).
        better = better * labels[:, None] ** 2
    pairs = better.sum().clamp(min=1e-6 if loss == "rank_top" else 1.0)
    return (torch.nn.functional.softplus(-diff) * better).sum() / pairs


def fit(
    model: FelixMLP,
    groups: list[Group],
    loss: str = "rank",
    epochs: int = 40,
    lr: float = 7e-4,
    batch: int = 128,
    seed: int = 0,
    progress=None,
) -> list[float]:
    """Train ``model`` in place; returns the mean loss per epoch."""
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {', '.join(LOSSES)}, not {loss!r}")
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    prepared = []
    for g in groups:
        features, mask = pad(g.programs)
        prepared.append((features, mask, torch.as_tensor(g.labels, dtype=torch.float32)))
    optim = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=1e-6)
    history = []
    model.train()
    for _ in range(epochs):
        losses = []
        for gi in rng.permutation(len(prepared)):
            features, mask, labels = prepared[gi]
            for chunk in np.array_split(rng.permutation(len(labels)), max(1, len(labels) // batch)):
                if len(chunk) < 2:
                    continue
                idx = torch.as_tensor(chunk)
                value = _group_loss(model, features[idx], mask[idx], labels[idx], loss)
                optim.zero_grad()
                value.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                optim.step()
                losses.append(float(value.detach()))
        history.append(float(np.mean(losses)) if losses else 0.0)
        if progress is not None:
            progress()
    model.eval()
    return history


def ranks(values: np.ndarray) -> np.ndarray:
    """0-based ranks of ``values`` (the smallest 0), ties sharing the mean of their places."""
    order = np.argsort(values, kind="stable")
    out = np.empty(len(values))
    out[order] = np.arange(len(values))
    # Average the ranks of ties so constant predictions do not look ordered.
    for v in np.unique(values):
        tie = values == v
        out[tie] = out[tie].mean()
    return out


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation of ``a`` and ``b`` (NaN when either side is constant)."""
    ra, rb = ranks(np.asarray(a, dtype=float)), ranks(np.asarray(b, dtype=float))
    denom = np.sqrt(((ra - ra.mean()) ** 2).sum() * ((rb - rb.mean()) ** 2).sum())
    return float(((ra - ra.mean()) * (rb - rb.mean())).sum() / denom) if denom else math.nan


def group_metrics(scores: np.ndarray, latencies: np.ndarray) -> dict[str, float]:
    """Ranking quality of ``scores`` (higher = predicted faster) within one workload."""
    speed = -latencies
    i, j = np.triu_indices(len(speed), 1)
    distinct = np.abs(latencies[i] - latencies[j]) > 0.01 * np.minimum(latencies[i], latencies[j])
    agree = np.sign(scores[i] - scores[j]) == np.sign(speed[i] - speed[j])
    pairwise = float(agree[distinct].mean()) if distinct.any() else float("nan")
    best = int(np.argmin(latencies))
    order = np.argsort(-scores, kind="stable")
    rho = spearman(scores, speed)
    return {
        "pairwise": pairwise,
        "top1": float(best in order[:1]),
        "top5": float(best in order[:5]),
        # A constant prediction orders nothing: scored as no correlation, not left out.
        "spearman": 0.0 if math.isnan(rho) else rho,
    }


def summarize(per_group: list[tuple[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Mean metrics per family and ``overall`` (each workload weighs the same)."""
    families: dict[str, list[dict[str, float]]] = {}
    for family, metrics in per_group:
        families.setdefault(family, []).append(metrics)
        families.setdefault("overall", []).append(metrics)
    out = {}
    for family, rows in families.items():
        out[family] = {k: round(float(np.nanmean([r[k] for r in rows])), 4) for k in rows[0]} | {
            "workloads": len(rows)
        }
    return out


def predict(model: FelixMLP, programs: list[torch.Tensor]) -> np.ndarray:
    with torch.no_grad():
        return model.score(programs).numpy().astype(float)
