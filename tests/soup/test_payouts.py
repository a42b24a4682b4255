"""Rewards: the pool is split by agreement with the aggregate and by participation; attackers earn nothing."""

from __future__ import annotations

import pytest
import torch

from gym.soup import payouts as rewards
from gym.soup.sources import InMemorySource


def _gram(source):
    from gym.soup.aggregators import gram_matrix

    return gram_matrix(source)


def test_quality_is_agreement_with_what_the_others_put_into_the_aggregate():
    xs = [torch.tensor([2.0, 0.0, 0.0]), torch.tensor([1.0, 1.0, 0.0]), torch.tensor([-1.0, 0.0, 0.0]),
          torch.tensor([0.0, 0.0, 9.0]), torch.tensor([1.0, 0.0, 0.0])]
    source = InMemorySource([{"w": x} for x in xs])
    weights = [0.2] * 5
    aggregate = {"w": sum(w * x for w, x in zip(weights, xs))}
    q = rewards.qualities(source, aggregate, weights, selected=[0, 1, 2, 3, 4], gram=_gram(source))
    rest = [aggregate["w"] - 0.2 * x for x in xs]
    expected = [max(0.0, float(torch.nn.functional.cosine_similarity(x, r, dim=0))) for x, r in zip(xs, rest)]
    assert q == pytest.approx(expected, abs=1e-6)  # float32 Gram entries: ~1e-7 relative
    assert q[3] < 1e-6  # orthogonal to everyone else: its own share of the aggregate earns it nothing
    assert q[2] == 0.0 and q[0] > 0  # opposed earns 0
    assert rewards.qualities(source, aggregate, weights, [0, 1], _gram(source))[2:] == [0.0] * 3  # not selected


def test_a_single_pick_is_compared_with_the_aggregate_itself():
    source = InMemorySource([{"w": torch.tensor([1.0, 0.0])}, {"w": torch.tensor([0.0, 1.0])}])
    q = rewards.qualities(source, {"w": torch.tensor([1.0, 0.0])}, [1.0, 0.0], [0], _gram(source))
    assert q == pytest.approx([1.0, 0.0])  # Krum's choice: A is x_0, so A_-0 is empty


def test_participation_needs_a_quarter_of_the_median_agreement():
    q = [0.8, 0.6, 0.05, 0.0, 0.9]  # median of the selected four: 0.325, floor 0.081
    assert rewards.participation(q, selected=[0, 1, 2, 3]) == [1.0, 1.0, 0.0, 0.0, 0.0]


def test_a_round_pays_out_the_whole_pool_by_the_formula():
    amounts = rewards.split([0.9, 0.3, 0.0], [1.0, 1.0, 0.0], pool=1000.0, quality_weight=0.7, participation_weight=0.3)
    assert sum(amounts) == pytest.approx(1000.0)
    assert amounts[0] == pytest.approx(1000 * (0.7 * 0.9 / 1.2 + 0.3 * 0.5))
    assert amounts[2] == 0.0 and amounts[0] > amounts[1]


def test_weights_are_normalised_and_nobody_participating_pays_nothing():
    assert sum(rewards.split([1.0, 1.0], [1.0, 1.0], 10.0, 3.0, 3.0)) == pytest.approx(10.0)
    assert rewards.split([0.2, 0.4], [0.0, 1.0], 10.0, 0.7, 0.3) == pytest.approx([0.0, 10.0])
    assert rewards.split([0.0, 0.0], [0.0, 0.0], 10.0, 0.7, 0.3) == [0.0, 0.0]


def test_reputation_is_an_exponential_moving_average_from_the_first_quality():
    first = rewards.updated_reputation(None, 0.6, decay=0.9)
    assert first == 0.6
    assert rewards.updated_reputation(first, 0.0, decay=0.9) == pytest.approx(0.54)
    assert rewards.newcomer_reputation([0.1, 0.3, 0.2]) == pytest.approx(0.2)  # the median known contributor
    assert rewards.newcomer_reputation([]) == rewards.NEWCOMER_REPUTATION
    assert rewards.mean_weights([None, 0.8, 0.0], [None, 10, 2], newcomer=0.2) == pytest.approx(
        [0.2, 8.0, rewards.MIN_WEIGHT * 2])


def test_in_a_soup_attackers_earn_nothing_and_a_sloppy_contributor_earns_less(make_soup, honest, direction, noise):
    soup = make_soup(reward_pool=1000.0)  # byzantine_robust (default)
    for i in range(4):
        soup.contribute(f"honest{i}", honest(i))
    soup.contribute("sloppy", honest(9, noise=0.45))  # same direction, more of its own noise (not filtered out)
    soup.contribute("flipper", {n: -3 * v for n, v in direction.items()})
    soup.contribute("noiser", noise(5, norm=3.0))
    soup.contribute("broken", {next(iter(direction)): torch.full((3,), 1.0)})  # rejected: wrong shape
    soup.aggregate()
    paid = soup.calculate_rewards()
    assert paid["flipper"] == 0.0 and paid["noiser"] == 0.0 and paid["broken"] == 0.0
    assert sum(paid.values()) == pytest.approx(1000.0)
    assert min(paid[f"honest{i}"] for i in range(4)) > paid["sloppy"] > 0
    reputation = soup.reputation()
    assert reputation["honest0"] > reputation["sloppy"] > reputation["flipper"] == reputation["broken"]
    # a second round adds up
    for i in range(4):
        soup.contribute(f"honest{i}", honest(10 + i))
    soup.aggregate()
    assert sum(soup.calculate_rewards(cumulative=True).values()) == pytest.approx(2000.0)
    assert set(soup.calculate_rewards(round_id=2)) == {f"honest{i}" for i in range(4)}


def test_rewards_off_is_an_error_to_ask_about(make_soup, honest):
    from gym.core.errors import ConfigError

    soup = make_soup(method="mean", enable_rewards=False, min_contributors=1)
    soup.contribute("a", honest(0))
    soup.aggregate()
    with pytest.raises(ConfigError, match="enable_rewards"):
        soup.calculate_rewards()
    assert "a" in soup.reputation()  # reputation still kept: weighted_mean needs it
