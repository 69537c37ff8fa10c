"""Leave-out pretraining: the workloads named are never trained on, the rest exactly as usual."""

from __future__ import annotations

import numpy as np
import torch

from gradtune.costmodel.leave_out import leaked, pretrain_leaving_out, workloads_of_models
from gradtune.costmodel.model import FelixMLP
from gradtune.costmodel.train import Group, fit


def _groups() -> list[Group]:
    torch.manual_seed(1)
    groups = []
    for w in range(4):
        programs = [torch.randn(2, 164) for _ in range(12)]
        latencies = np.array([1.0 + np.exp(-float(p[0, 0])) for p in programs]) * (w + 1)
        groups.append(Group(f"k{w}", "fam", programs, latencies))
    return groups


def test_workloads_of_models_covers_every_batch_of_the_model() -> None:
    manifest = {
        "k0": {"models": ["resnet18_like"]},  # its batch-1 instance
        "k1": {"models": ["resnet18_like", "vit_like"]},  # shared with another model
        "k2": {"models": ["vit_like"]},
        "k3": {"models": ["resnet18_like"]},  # its batch-4 instance
    }
    assert workloads_of_models(manifest, ["resnet18_like"]) == {"k0", "k1", "k3"}
    assert workloads_of_models(manifest, []) == set()


def test_pretrain_leaving_out_trains_on_the_rest_only() -> None:
    groups = _groups()
    model, info = pretrain_leaving_out(groups, {"k1", "k3"}, "rank", epochs=2, lr=7e-4, seed=0)
    assert info["workloads"] == 2 and info["left_out"] == 2 and info["records"] == 24
    kept = [g for g in groups if g.name not in {"k1", "k3"}]
    assert leaked(kept, {"k1", "k3"}) == 0 and leaked(groups, {"k1", "k3"}) == 2
    # The same training as the pretrain stage's on the kept groups: identical weights.
    torch.manual_seed(0)
    direct = FelixMLP()
    fit(direct, kept, loss="rank", epochs=2, lr=7e-4, seed=0)
    for a, b in zip(model.state_dict().values(), direct.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    # ...and not what training on everything gives.
    everything, _ = pretrain_leaving_out(groups, set(), "rank", epochs=2, lr=7e-4, seed=0)
    assert not torch.equal(everything.head.weight, model.head.weight)
