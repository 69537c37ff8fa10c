"""What the gradient search climbs when its cost model is an ensemble (AdaTune §4.2–4.3).

**Expected improvement**, not UCB: EI over the task's best measured program needs no β
schedule, and it is scale-free relative to that incumbent, which matters because μ and σ are in
standardized units that change from task to task (``costmodel.ensemble.Scale``). AdaTune scores
with EI too. The descent climbs log EI (Ament et al., "Unexpected improvements to expected
improvement", 2023): random seeds start many σ below the incumbent, where EI itself underflows
to 0 and has no gradient, while its logarithm keeps one.

**Contextual exploration** (AdaTune Eq. 3): the round's exploration share is the ensemble's
mean σ over random programs divided by the best predicted performance among them, clamped.
On the standardized scale a random program's μ averages 0, so the best predicted performance is
measured from an average random program: max μ. A model that is unsure relative to how much
better it thinks the best can be explores more.
"""

from __future__ import annotations

import math

import torch

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
_LOG_SQRT_PI_2 = 0.5 * math.log(math.pi / 2)


def _log_h(u: torch.Tensor) -> torch.Tensor:
    """log(φ(u) + u Φ(u)), stable for every u."""
    # Above -1 the direct form is exact in float64; below, φ(u) + uΦ(u) cancels, so it is
    # rewritten with the scaled complementary error function:
    # h(u) = φ(u) (1 − |u| √(π/2) erfcx(|u|/√2)).
    direct_u = u.clamp(min=-1.0)
    normal = torch.distributions.Normal(
        torch.zeros((), dtype=u.dtype), torch.ones((), dtype=u.dtype)
    )
    direct = torch.log(normal.log_prob(direct_u).exp() + direct_u * normal.cdf(direct_u))
    tail_u = u.clamp(max=-1.0)
    a = torch.log(torch.special.erfcx(-tail_u / math.sqrt(2)) * tail_u.abs()) + _LOG_SQRT_PI_2
    # log(1 − e^a) for a < 0, both branches of log1mexp kept accurate.
    log1mexp = torch.where(a > -math.log(2), torch.log(-torch.expm1(a)), torch.log1p(-torch.exp(a)))
    tail = -0.5 * tail_u**2 - _LOG_SQRT_2PI + log1mexp
    return torch.where(u > -1.0, direct, tail)


def log_expected_improvement(mu: torch.Tensor, sigma: torch.Tensor, best: float) -> torch.Tensor:
    """log E[max(f − best, 0)] for f ~ N(μ, σ²), elementwise; higher is more promising."""
    sigma = sigma.clamp(min=1e-9)
    u = (mu - best) / sigma
    return torch.log(sigma) + _log_h(u.to(torch.float64)).to(mu.dtype)


def contextual_epsilon(
    mu_random: torch.Tensor, sigma_random: torch.Tensor, bounds: tuple[float, float]
) -> float:
    """AdaTune's ε_t = mean σ / best predicted performance over random programs, clamped to
    ``bounds``; the upper bound when the model predicts nothing above average (max μ ≤ 0)."""
    lo, hi = bounds
    finite = torch.isfinite(mu_random) & torch.isfinite(sigma_random)
    if not bool(finite.any()):
        return hi
    best = float(mu_random[finite].max())
    if best <= 0:
        return hi
    return float(min(hi, max(lo, float(sigma_random[finite].mean()) / best)))
