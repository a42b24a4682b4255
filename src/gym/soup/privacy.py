"""Differential privacy for DeltaSoup: clip each contribution, add Gaussian noise to the aggregate.

Neighbouring rounds differ in one contribution replaced by another (replace-one). Each contribution is
first scaled to whole-model L2 norm at most C = clip_norm (``clip_scales``; a ``ScaledSource`` applies it
without copying the data). The aggregate then gets N(0, sigma^2) noise on every coordinate, with sigma
calibrated to the aggregator's L2 sensitivity Delta (the most one replaced contribution can move it):

=====================================  ==========================  =========================================
aggregator                             Delta                       why
=====================================  ==========================  =========================================
mean                                   2C / n                      (x_i - x_i') / n, each of norm <= C
weighted_mean (weights fixed before    2C * max_i w_i              w_i (x_i - x_i'), weights normalised;
the round, not from this round's data)                             data-dependent weights void this bound
trimmed_mean, k trimmed per end        2C * sqrt(n / (n - 2k))     per coordinate m_j^2 <= mean of the kept
                                       (2C / n when k = 0)         x_ij^2 (Jensen), so |m|^2 <= n C^2/(n-2k)
median (coordinate-wise)               2 sqrt(2) C                 at least half the x_ij have |x_ij| >= |m_j|,
                                                                   so |m|^2 <= (2/n) sum_i |x_i|^2 <= 2 C^2
krum, multi_krum, geometric_median,    2C                          a convex combination of (clipped) inputs,
byzantine_robust                                                   so |output| <= C on both sides
=====================================  ==========================  =========================================

The robust rows are not typos: a data-dependent selection can jump from one input to another when a
single contribution changes, so only the output's norm bounds the change. For the same (epsilon, delta)
a robust aggregator needs about n times more noise than the mean (Delta 2C against 2C/n): with 100
contributors, 100 times the standard deviation. Robustness and privacy pull against each other; choose
knowingly. (A coordinate-wise trimmed mean or median is *not* a convex combination of the inputs: three
unit vectors (1,1,0)/sqrt2, (1,0,1)/sqrt2, (0,1,1)/sqrt2 have median (1,1,1)/sqrt2, of norm 1.22.)

Calibration (``gaussian_sigma``): for epsilon < 1 the classical bound sigma = Delta sqrt(2 ln(1.25/delta)) /
epsilon (Dwork & Roth, Thm A.1); from epsilon >= 1, where the classical bound is not valid, the analytic
Gaussian mechanism (Balle & Wang, 2018, Thm 8): the smallest sigma with
Phi(Delta/(2 sigma) - epsilon sigma/Delta) - e^epsilon Phi(-Delta/(2 sigma) - epsilon sigma/Delta) <= delta,
found by bisection. The analytic sigma is also valid, and smaller, below epsilon = 1 (``analytic_sigma``).

Composition over rounds (``total_privacy``): a Gaussian mechanism with sensitivity Delta and std sigma is
rho = Delta^2 / (2 sigma^2)-zCDP (Bun & Steinke, 2016, Prop 1.6); rho adds up over rounds, and rho-zCDP
implies (rho + 2 sqrt(rho ln(1/delta)), delta)-DP (Prop 1.3). Basic composition (sum of the per-round
epsilons, at the sum of the per-round deltas) is also reported; ``epsilon`` is the smaller of the two,
``delta`` the delta that goes with it. zCDP wins after a few rounds; basic wins for a single round.

Limits: the noise comes from torch's float32 sampler, not a floating-point-safe one (Mironov, 2012), and a
fixed noise seed makes the noise predictable: both are fine for research, not for adversarial settings.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gym.core.errors import ConfigError
from gym.soup.aggregators import AggregationMethod, method_of, trim_count

# The methods whose sensitivity above counts every contribution as in, once (2C/n, 2C max w_i, the trimmed
# bound with n): under DP a soup neither screens norms nor merges near-copies for them (gym.soup.screen would
# make membership depend on the data). The other bounds hold for any subset or mean of clipped inputs.
MEMBERSHIP_FIXED = (AggregationMethod.MEAN, AggregationMethod.WEIGHTED_MEAN, AggregationMethod.TRIMMED_MEAN)


def clip_scales(norms: Sequence[float] | torch.Tensor, clip_norm: float) -> list[float]:
    """min(1, C / |x_i|) per contribution: the factor that brings each norm to at most C."""
    if not clip_norm > 0:
        raise ConfigError(f"clip_norm={clip_norm} must be positive.")
    values = norms.tolist() if isinstance(norms, torch.Tensor) else [float(v) for v in norms]
    return [1.0 if v <= clip_norm else clip_norm / v for v in values]


def _check(epsilon: float, delta: float, sensitivity: float) -> None:
    if not epsilon > 0:
        raise ConfigError(f"privacy_epsilon={epsilon} must be positive.")
    if not 0 < delta < 1:
        raise ConfigError(f"privacy_delta={delta} must be between 0 and 1 (exclusive).")
    if not sensitivity >= 0:
        raise ConfigError(f"sensitivity={sensitivity} must be non-negative.")


def classical_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """Delta sqrt(2 ln(1.25/delta)) / epsilon; the proof holds for epsilon < 1 only."""
    _check(epsilon, delta, sensitivity)
    if epsilon >= 1:
        raise ConfigError(f"The classical Gaussian bound needs epsilon < 1 (got {epsilon}); use analytic_sigma.")
    return sensitivity * math.sqrt(2 * math.log(1.25 / delta)) / epsilon


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2))


def balle_wang_delta(epsilon: float, sensitivity: float, sigma: float) -> float:
    """The exact delta of the Gaussian mechanism at this epsilon (Balle & Wang, 2018, Thm 8)."""
    a, b = sensitivity / (2 * sigma), epsilon * sigma / sensitivity
    tail = _phi(-a - b)
    # e^epsilon * tail in log space: e^epsilon alone overflows past epsilon ~ 709.
    scaled = 0.0 if tail == 0 else math.exp(min(epsilon + math.log(tail), 700.0))
    return _phi(a - b) - scaled


def analytic_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """The smallest sigma for which the Gaussian mechanism is (epsilon, delta)-DP, by bisection."""
    _check(epsilon, delta, sensitivity)
    if sensitivity == 0:
        return 0.0
    hi = sensitivity
    while balle_wang_delta(epsilon, sensitivity, hi) > delta:
        hi *= 2
    lo = hi / 2
    while balle_wang_delta(epsilon, sensitivity, lo) <= delta:
        lo /= 2
    while hi - lo > 1e-12 * hi:  # invariant: lo fails, hi satisfies; return the satisfying side
        mid = (lo + hi) / 2
        if balle_wang_delta(epsilon, sensitivity, mid) > delta:
            lo = mid
        else:
            hi = mid
    return hi


def gaussian_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """The noise std used by DeltaSoup: classical below epsilon = 1, analytic from 1 (module docstring)."""
    if epsilon < 1:
        return classical_sigma(epsilon, delta, sensitivity)
    return analytic_sigma(epsilon, delta, sensitivity)


def sensitivity(method: AggregationMethod | str, clip_norm: float, n: int, weights: Sequence[float] | None = None,
                *, num_byzantine: int | None = None, trim_percent: float = 0.1) -> float:
    """L2 sensitivity of one round's aggregate under replace-one neighbours (table in the module docstring).

    num_byzantine and trim_percent matter for trimmed_mean only and must be the ones passed to aggregate().
    """
    kind = method_of(method)
    if not clip_norm > 0 or n < 1:
        raise ConfigError(f"Sensitivity needs clip_norm > 0 and at least one contribution (got {clip_norm}, {n}).")
    if kind is AggregationMethod.MEAN:
        return 2 * clip_norm / n
    if kind is AggregationMethod.WEIGHTED_MEAN:
        if weights is None or len(weights) != n or sum(weights) <= 0 or min(weights) < 0:
            raise ConfigError("weighted_mean sensitivity needs the n non-negative weights fixed before the round.")
        return 2 * clip_norm * max(weights) / sum(weights)
    if kind is AggregationMethod.MEDIAN:
        return 2 * math.sqrt(2) * clip_norm
    if kind is AggregationMethod.TRIMMED_MEAN:
        k = trim_count(n, num_byzantine, trim_percent)
        return 2 * clip_norm / n if k == 0 else 2 * clip_norm * math.sqrt(n / (n - 2 * k))
    return 2 * clip_norm  # Krum family, geometric median, byzantine_robust: convex combinations


@torch.no_grad()
def add_gaussian_noise(delta: dict[str, torch.Tensor], sigma: float,
                       generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
    """A new dict: every tensor plus i.i.d. N(0, sigma^2) noise (names drawn in sorted order)."""
    if not sigma >= 0:
        raise ConfigError(f"Noise sigma={sigma} must be non-negative.")
    noisy = {}
    for name in sorted(delta):
        value = delta[name].to(torch.float32)
        noise = torch.randn(value.shape, generator=generator, dtype=torch.float32)
        noisy[name] = value + sigma * noise
    return {name: noisy[name] for name in delta}


@dataclass
class PrivacyReport:
    """What one round spent: its (epsilon, delta), the noise std and sensitivity, and its zCDP rho."""

    epsilon: float
    delta: float
    sigma: float
    sensitivity: float
    rho: float


def zcdp_rho(sensitivity: float, sigma: float) -> float:
    """rho of the Gaussian mechanism: Delta^2 / (2 sigma^2)."""
    if sensitivity == 0:
        return 0.0
    return math.inf if sigma == 0 else sensitivity ** 2 / (2 * sigma ** 2)


def calibrate(epsilon: float, delta: float, sensitivity: float) -> PrivacyReport:
    """The noise for one round at (epsilon, delta), and what it spends."""
    sigma = gaussian_sigma(epsilon, delta, sensitivity)
    return PrivacyReport(epsilon, delta, sigma, sensitivity, zcdp_rho(sensitivity, sigma))


def total_privacy(rounds: Sequence[PrivacyReport], delta: float) -> dict[str, float]:
    """Privacy spent over all rounds: zCDP composition converted at `delta`, and basic composition."""
    if not 0 < delta < 1:
        raise ConfigError(f"delta={delta} must be between 0 and 1 (exclusive).")
    rho = sum(r.rho for r in rounds)
    eps_zcdp = rho + 2 * math.sqrt(rho * math.log(1 / delta))
    eps_basic = sum(r.epsilon for r in rounds)
    delta_basic = sum(r.delta for r in rounds)
    basic_wins = eps_basic < eps_zcdp
    return {"epsilon_zcdp": eps_zcdp, "epsilon_basic": eps_basic, "delta_basic": delta_basic, "rho": rho,
            "epsilon": eps_basic if basic_wins else eps_zcdp, "delta": delta_basic if basic_wins else delta,
            "rounds": len(rounds)}
