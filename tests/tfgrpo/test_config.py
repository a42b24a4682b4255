"""GRPOConfig refuses values the loop cannot use, naming the field and what it takes."""

from __future__ import annotations

import re

import pytest

from gym.core.errors import ConfigError
from gym.tfgrpo.config import GRPOConfig


@pytest.mark.parametrize("options, says", [
    ({"batch_size": "8"}, "'batch_size' must be a whole number of at least 1"),
    ({"max_words": 0}, "'max_words' must be a whole number of at least 1"),
    ({"eval_samples": 2.5}, "'eval_samples' must be a whole number of at least 1"),
    ({"temperature_eval": float("nan")}, "'temperature_eval' must be in [0, 2]"),
    ({"max_retries": -1}, "'max_retries' must be a whole number of at least 0"),
    ({"retry_delay": float("inf")}, "'retry_delay' must be a number >= 0"),
    ({"shuffle": "no"}, "'shuffle' must be True or False"),
    ({"base_url": 8000}, "'base_url' must be a string or None"),
    ({"prices": {"rollout": [1.0, -2.0]}}, "prices.rollout: give [dollars per 1M prompt tokens"),
    ({"prices": [1.0, 2.0]}, "'prices' maps a role"),
])
def test_impossible_values_are_refused_naming_the_field(options, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        GRPOConfig(**options)


def test_legitimate_edge_values_are_kept():
    config = GRPOConfig(group_size=2, temperature_train=0, temperature_update=2, max_retries=0, max_parse_retries=0,
                        retry_delay=0, prices={"rollout": [0, 0.6]}, seed=-3)
    assert config.group_size == 2 and config.prices == {"rollout": [0, 0.6]}
