"""AdaTune's surrogate for the gradient search: a deep ensemble standardized per task, its log
expected improvement and the contextual exploration share (Eq. 3)."""

import math

import mpmath
import numpy as np
import pytest
import torch

from gradtune.costmodel import ensemble
from gradtune.costmodel.model import FelixMLP
from gradtune.costmodel.online import OnlineCostModel
from gradtune.costmodel.train import Group
from gradtune.search.acquisition import contextual_epsilon, log_expected_improvement


def exact_log_ei(mu: float, sigma: float, best: float) -> float:
    """log EI in 50-digit arithmetic: σ (φ(u) + u Φ(u)), u = (μ − best) / σ."""
    mpmath.mp.dps = 50
    u = mpmath.mpf(mu - best) / sigma
    pdf = mpmath.exp(-(u**2) / 2) / mpmath.sqrt(2 * mpmath.pi)
    cdf = mpmath.ncdf(u)
    return float(mpmath.log(sigma * (pdf + u * cdf)))


@pytest.mark.parametrize("u", [3.0, 0.5, 0.0, -0.99, -1.0, -1.01, -4.0, -12.0, -40.0, -300.0])
def test_log_expected_improvement_is_exact_far_below_the_incumbent(u):
    """Random seeds start many σ below the incumbent, where EI itself underflows: its log stays
    exact there and keeps a gradient that points up."""
    mu = torch.tensor([u * 0.5], dtype=torch.float64, requires_grad=True)
    value = log_expected_improvement(mu, torch.tensor([0.5], dtype=torch.float64), 0.0)
    assert math.isclose(
        float(value.detach()), exact_log_ei(u * 0.5, 0.5, 0.0), rel_tol=1e-7, abs_tol=1e-9
    )
    value.sum().backward()
    assert torch.isfinite(mu.grad).all() and float(mu.grad) > 0


def test_contextual_epsilon_is_eq3_clamped():
    mu = torch.tensor([-1.0, 0.0, 2.0])
    assert contextual_epsilon(mu, torch.tensor([0.4, 0.4, 0.4]), (0.05, 0.5)) == pytest.approx(0.2)
    assert contextual_epsilon(mu, torch.tensor([0.01] * 3), (0.05, 0.5)) == 0.05
    assert contextual_epsilon(mu, torch.tensor([3.0] * 3), (0.05, 0.5)) == 0.5
    # Nothing predicted above an average random program: explore as much as allowed.
    assert contextual_epsilon(-mu.abs(), torch.tensor([0.1] * 3), (0.05, 0.5)) == 0.5
    nan = torch.tensor([math.nan] * 3)
    assert contextual_epsilon(nan, nan, (0.05, 0.5)) == 0.5


def test_members_on_one_scale_and_wild_ones_left_out():
    """Each member standardized over random programs; a member's NaN or inf score is left out
    of that program's μ and σ and counted, never propagated."""
    raw = torch.tensor([[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0], [4.0, 3.0, 2.0, 1.0]])
    scale = ensemble.Scale.fit(raw)
    mu, sigma, dropped = scale.mu_sigma(raw)
    z = (raw - raw.mean(1, keepdim=True)) / raw.std(1, keepdim=True)
    torch.testing.assert_close(mu, z.mean(0))
    torch.testing.assert_close(sigma, z.std(0))
    assert dropped == 0
    wild = raw.clone()
    wild[1, 2] = math.inf
    wild[2, 3] = math.nan
    mu, sigma, dropped = scale.mu_sigma(wild)
    assert dropped == 2 and torch.isfinite(mu).all() and torch.isfinite(sigma).all()
    torch.testing.assert_close(mu[2], z[[0, 2], 2].mean())
    # A program no two members score finitely has no μ: the caller drops it.
    wild[:2, 0] = math.nan
    assert math.isnan(float(scale.mu_sigma(wild)[0][0]))
    # A member not finite on the random programs has no scale and is left out everywhere.
    broken = raw.clone()
    broken[0, 1] = math.nan
    mu, _, dropped = ensemble.Scale.fit(broken).mu_sigma(raw)
    assert dropped == 4 and torch.isfinite(mu).all()


def members(count: int = 4) -> list[FelixMLP]:
    out = []
    for k in range(count):
        torch.manual_seed(k)
        out.append(FelixMLP().eval())
    return out


def test_members_save_in_half_precision_and_load_as_float(tmp_path):
    models = members()
    path = tmp_path / "ensemble.pt"
    ensemble.save_members(models, path)
    assert path.stat().st_size < 0.6 * 4 * sum(p.numel() for p in models[0].parameters()) * 4
    loaded = ensemble.load_members(path)
    programs = [torch.randn(3, 164), torch.randn(5, 164)]
    with torch.no_grad():
        torch.testing.assert_close(
            ensemble.member_scores(loaded, programs),
            ensemble.member_scores(models, programs),
            atol=2e-2, rtol=2e-2,
        )  # fmt: skip
    ensemble.save_members(models[:1], path)
    with pytest.raises(ValueError, match="two or more members"):
        ensemble.load_members(path)


def test_online_ensemble_fine_tunes_every_member_and_saves_them(tmp_path):
    models = members()
    online = OnlineCostModel(models[0], epochs=2, members=models)
    before = [m.head.weight.detach().clone() for m in models]
    rng = np.random.default_rng(0)
    programs = [torch.tensor(rng.normal(size=(2, 164)), dtype=torch.float32) for _ in range(6)]
    online.observe("task", programs, list(np.linspace(1e-3, 6e-3, 6)))
    assert all(not torch.equal(b, m.head.weight) for b, m in zip(before, models, strict=True))
    with torch.no_grad():
        scores = online.member_scores(programs)
    assert scores.shape == (4, 6)
    path = tmp_path / "online.pt"
    online.save(str(path))
    fresh = OnlineCostModel(FelixMLP())
    fresh.load(str(path))
    assert len(fresh.members) == 4 and fresh.members[0] is fresh.model
    with torch.no_grad():
        torch.testing.assert_close(fresh.member_scores(programs), scores)
    with pytest.raises(ValueError, match="first being"):
        OnlineCostModel(FelixMLP(), members=models)


def test_pretrained_members_differ_by_seed():
    rng = np.random.default_rng(0)
    groups = [
        Group(f"w{i}", "matmul", [torch.tensor(rng.normal(size=(2, 164)), dtype=torch.float32)
                                  for _ in range(8)], rng.uniform(1e-3, 2e-3, 8))
        for i in range(3)
    ]  # fmt: skip
    models, losses = ensemble.pretrain_members(groups, 2, "rank", 2, 7e-4, seed=5)
    assert len(models) == 2 and all(math.isfinite(x) for x in losses)
    assert not torch.equal(models[0].head.weight, models[1].head.weight)
