"""Differential privacy: clipping, noise calibration (classical and analytic), sensitivities, accounting."""

from __future__ import annotations

import math

import pytest
import torch

from gym.core.errors import ConfigError
from gym.soup import privacy
from gym.soup.aggregators import aggregate, gram_matrix, norms, scaled_gram
from gym.soup.sources import InMemorySource, ScaledSource


def exact_delta(epsilon: float, sensitivity: float, sigma: float) -> float:
    """Balle & Wang (2018), Theorem 8, written out again here so the test does not trust the module."""
    phi = lambda x: 0.5 * math.erfc(-x / math.sqrt(2))  # noqa: E731
    a, b = sensitivity / (2 * sigma), epsilon * sigma / sensitivity
    return phi(a - b) - math.exp(epsilon) * phi(-a - b)


def contributions(n: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [{"w": torch.randn(3, 5, generator=gen) * (i + 1), "b": torch.randn(7, generator=gen)} for i in range(n)]


def flat(delta: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([delta[k].reshape(-1) for k in sorted(delta)]).double()


def test_clipping_brings_every_norm_to_at_most_c():
    source = InMemorySource(contributions(8))
    gram = gram_matrix(source)
    clip = float(norms(gram).median())
    scales = privacy.clip_scales(norms(gram), clip)
    clipped_gram = gram_matrix(ScaledSource(source, scales))
    after = norms(clipped_gram)
    assert bool((after <= clip * (1 + 1e-6)).all())
    before = norms(gram)
    for i, s in enumerate(scales):  # under the bound: untouched; over it: exactly at it
        assert s == 1.0 if before[i] <= clip else math.isclose(float(after[i]), clip, rel_tol=1e-5)
    torch.testing.assert_close(scaled_gram(gram, scales), clipped_gram, rtol=1e-5, atol=1e-6 * clip ** 2)
    assert privacy.clip_scales([0.0, 2.0], 1.0) == [1.0, 0.5]


def test_sigma_grows_as_epsilon_shrinks():
    epsilons = [20, 8, 3, 1.5, 1.0, 0.99, 0.7, 0.3, 0.1, 0.02]
    sigmas = [privacy.gaussian_sigma(e, 1e-5, 1.0) for e in epsilons]
    assert all(b > a for a, b in zip(sigmas, sigmas[1:]))
    assert privacy.gaussian_sigma(0.5, 1e-5, 3.0) == pytest.approx(3 * privacy.gaussian_sigma(0.5, 1e-5, 1.0))


@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-9])
@pytest.mark.parametrize("epsilon", [0.05, 0.5, 0.95])
def test_analytic_sigma_is_tight_and_never_above_classical(epsilon, delta):
    analytic = privacy.analytic_sigma(epsilon, delta, 2.0)
    assert analytic <= privacy.classical_sigma(epsilon, delta, 2.0)
    assert exact_delta(epsilon, 2.0, analytic) <= delta * (1 + 1e-9)  # private enough
    assert exact_delta(epsilon, 2.0, analytic * (1 - 1e-6)) > delta  # and no more noise than needed


@pytest.mark.parametrize("epsilon", [1.0, 4.0, 50.0])
def test_analytic_sigma_above_one_satisfies_balle_wang(epsilon):
    sigma = privacy.gaussian_sigma(epsilon, 1e-6, 1.0)
    assert sigma == privacy.analytic_sigma(epsilon, 1e-6, 1.0)
    assert exact_delta(epsilon, 1.0, sigma) <= 1e-6 * (1 + 1e-9) < exact_delta(epsilon, 1.0, sigma * (1 - 1e-6))


def test_classical_bound_is_the_textbook_formula_and_refuses_epsilon_from_one():
    assert privacy.gaussian_sigma(0.5, 1e-5, 1.0) == pytest.approx(math.sqrt(2 * math.log(1.25e5)) / 0.5)
    with pytest.raises(ConfigError, match="epsilon < 1"):
        privacy.classical_sigma(1.0, 1e-5, 1.0)
    for bad, message in [((0.0, 1e-5), r"privacy_epsilon=0\.0 must be positive"),
                         ((-1.0, 1e-5), r"privacy_epsilon=-1\.0 must be positive"),
                         ((1.0, 0.0), r"privacy_delta=0\.0 must be between 0 and 1"),
                         ((1.0, 1.0), r"privacy_delta=1\.0 must be between 0 and 1")]:
        with pytest.raises(ConfigError, match=message):
            privacy.gaussian_sigma(*bad, 1.0)


def test_sensitivity_per_method():
    c, n = 0.5, 10
    assert privacy.sensitivity("mean", c, n) == pytest.approx(2 * c / n)
    assert privacy.sensitivity("weighted_mean", c, 3, [1, 1, 2]) == pytest.approx(2 * c * 0.5)
    assert privacy.sensitivity("median", c, n) == pytest.approx(2 * math.sqrt(2) * c)
    assert privacy.sensitivity("trimmed_mean", c, n, trim_percent=0.2) == pytest.approx(2 * c * math.sqrt(10 / 6))
    assert privacy.sensitivity("trimmed_mean", c, n, trim_percent=0.0) == pytest.approx(2 * c / n)
    for method in ["krum", "multi_krum", "geometric_median", "byzantine_robust"]:
        assert privacy.sensitivity(method, c, n) == 2 * c
    with pytest.raises(ConfigError, match="weighted_mean sensitivity needs the n non-negative weights"):
        privacy.sensitivity("weighted_mean", c, 3)


def test_mean_sensitivity_is_reached_by_replacing_one_contribution():
    c, n = 1.0, 6
    others = [{"w": torch.zeros(4)} for _ in range(n - 1)]
    u = torch.tensor([c, 0.0, 0.0, 0.0])
    # As a soup runs the mean under DP (privacy.MEMBERSHIP_FIXED): every contribution in, once.
    plain = {"screen_ratio": None, "duplicate_cosine": None}
    a = aggregate(InMemorySource(others + [{"w": u}]), "mean", **plain).delta["w"]
    b = aggregate(InMemorySource(others + [{"w": -u}]), "mean", **plain).delta["w"]
    assert float((a - b).norm()) == pytest.approx(privacy.sensitivity("mean", c, n))


def test_coordinate_wise_median_can_exceed_c_but_not_sqrt2_c():
    # Why the median's sensitivity is 2 sqrt(2) C and not 2C: it is no convex combination of its inputs.
    rows = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0], [0.0, 1.0, 1.0]]) / math.sqrt(2)
    median = aggregate(InMemorySource([{"w": r} for r in rows]), "median").delta["w"]
    assert 1.0 < float(median.norm()) <= math.sqrt(2)
    gen = torch.Generator().manual_seed(1)
    for trial in range(20):
        x = torch.rand(9, 30, generator=gen) * (1 + trial % 3)
        x = x / x.norm(dim=1, keepdim=True)  # every contribution at norm C = 1
        source = InMemorySource([{"w": r} for r in x])
        assert float(aggregate(source, "median").delta["w"].norm()) <= math.sqrt(2) + 1e-6
        trimmed = aggregate(source, "trimmed_mean", num_byzantine=2).delta["w"]
        assert float(trimmed.norm()) <= math.sqrt(9 / 5) + 1e-6


@pytest.mark.parametrize("method", ["krum", "multi_krum", "geometric_median", "byzantine_robust"])
def test_robust_outputs_stay_within_the_clip_norm(method):
    # Their sensitivity 2C rests on |output| <= C for clipped inputs (a convex combination).
    source = InMemorySource(contributions(9, seed=2))
    gram = gram_matrix(source)
    scales = privacy.clip_scales(norms(gram), 1.0)
    out = aggregate(ScaledSource(source, scales), method, gram=scaled_gram(gram, scales)).delta
    assert float(flat(out).norm()) <= 1.0 + 1e-5


def test_noise_has_the_asked_std_and_is_reproducible_with_a_seed():
    delta = {"w": torch.zeros(200, 500), "b": torch.ones(7)}
    noisy = privacy.add_gaussian_noise(delta, 0.3, torch.Generator().manual_seed(0))
    again = privacy.add_gaussian_noise(delta, 0.3, torch.Generator().manual_seed(0))
    assert torch.equal(noisy["w"], again["w"]) and torch.equal(delta["w"], torch.zeros(200, 500))
    assert float(noisy["w"].std()) == pytest.approx(0.3, rel=0.02)
    assert abs(float(noisy["w"].mean())) < 0.01
    assert list(noisy) == ["w", "b"] and noisy["b"].shape == (7,)
    assert torch.equal(privacy.add_gaussian_noise(delta, 0.0)["b"], delta["b"])


def test_zcdp_composition_beats_basic_over_many_rounds():
    one = privacy.calibrate(1.0, 1e-5, 0.2)
    assert one.rho == pytest.approx(0.2 ** 2 / (2 * one.sigma ** 2)) == privacy.zcdp_rho(0.2, one.sigma)
    single = privacy.total_privacy([one], 1e-5)
    assert single["epsilon"] == single["epsilon_basic"] == 1.0 and single["delta"] == 1e-5  # basic wins
    many = privacy.total_privacy([one] * 50, 1e-5)
    rho = 50 * one.rho
    assert many["rho"] == pytest.approx(rho) and many["rounds"] == 50
    assert many["epsilon_zcdp"] == pytest.approx(rho + 2 * math.sqrt(rho * math.log(1e5)))
    assert many["epsilon_basic"] == pytest.approx(50.0) and many["delta_basic"] == pytest.approx(50e-5)
    assert many["epsilon"] == many["epsilon_zcdp"] < 50 and many["delta"] == 1e-5
    assert privacy.total_privacy([], 1e-5)["epsilon"] == 0.0
