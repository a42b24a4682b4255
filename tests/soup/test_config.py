"""DeltaSoupConfig: the seeds' names and defaults, strict checking, and the public import paths."""

from __future__ import annotations

import pytest

from gym.core.errors import ConfigError
from gym.soup import AggregationMethod, DeltaSoupConfig


def test_seed_names_are_importable_from_gym_quantization_and_gym_soup():
    import gym.quantization as quantization
    import gym.soup as soup

    assert quantization.DeltaSoup is soup.DeltaSoup
    assert quantization.DeltaSoupConfig is soup.DeltaSoupConfig
    assert quantization.AggregationMethod is soup.AggregationMethod


def test_defaults_are_a_robust_non_private_rewarding_soup():
    config = DeltaSoupConfig()
    assert config.method is AggregationMethod.BYZANTINE_ROBUST
    assert not config.differential_privacy and config.enable_rewards and config.validate_contributions
    assert config.min_contributors == 3 and config.max_contributors >= config.min_contributors


def test_method_is_taken_by_name_and_unknown_names_list_the_choices():
    assert DeltaSoupConfig(method="median").method is AggregationMethod.MEDIAN
    with pytest.raises(ConfigError, match="byzantine_robust"):
        DeltaSoupConfig(method="avg")


@pytest.mark.parametrize("field, value", [
    ("trim_percent", 0.5), ("trim_percent", -0.1), ("byzantine_threshold", 0.5), ("clip_norm", 0.0),
    ("quality_threshold", -1.0), ("min_contributors", 0), ("reward_pool", -1.0), ("max_norm", -2.0),
    ("reputation_decay", 1.0), ("validation_max_samples", 0)])
def test_out_of_range_values_are_refused_with_the_field_named(field, value):
    with pytest.raises(ConfigError, match=field):
        DeltaSoupConfig(**{field: value})


def test_privacy_parameters_are_checked_only_when_privacy_is_on():
    DeltaSoupConfig(privacy_epsilon=0.0)  # unused: no error
    with pytest.raises(ConfigError, match="privacy_epsilon"):
        DeltaSoupConfig(differential_privacy=True, privacy_epsilon=0.0)
    with pytest.raises(ConfigError, match="privacy_delta"):
        DeltaSoupConfig(differential_privacy=True, privacy_delta=1.0)


def test_impossible_combinations_are_refused():
    with pytest.raises(ConfigError, match="max_contributors"):
        DeltaSoupConfig(min_contributors=5, max_contributors=4)
    with pytest.raises(ConfigError, match="quality_weight and participation_weight"):
        DeltaSoupConfig(quality_weight=0.0, participation_weight=0.0)
    DeltaSoupConfig(quality_weight=0.0, participation_weight=0.0, enable_rewards=False)


def test_num_byzantine_is_the_assumed_share_of_attackers_rounded_down():
    config = DeltaSoupConfig(byzantine_threshold=0.3)
    assert [config.num_byzantine(n) for n in (3, 5, 7, 10)] == [0, 1, 2, 3]
    assert DeltaSoupConfig().num_byzantine(7) is None  # the aggregator's most defensive default


def test_dict_round_trip_and_unknown_fields():
    config = DeltaSoupConfig(method="trimmed_mean", differential_privacy=True, clip_norm=0.5, max_norm=3.0)
    values = config.to_dict()
    assert values["method"] == "trimmed_mean"  # JSON-friendly
    assert DeltaSoupConfig.from_dict(values) == config
    with pytest.raises(ConfigError, match="clip_nrom"):
        DeltaSoupConfig.from_dict({"clip_nrom": 1.0})


def test_krum_based_methods_need_rounds_of_at_least_three():
    with pytest.raises(ConfigError, match="at least 3"):
        DeltaSoupConfig(min_contributors=2)  # byzantine_robust filters by Krum scores
    DeltaSoupConfig(method="geometric_median", min_contributors=2)
