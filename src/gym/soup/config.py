"""DeltaSoupConfig: how a soup filters, merges, protects and rewards contributions.

The documented fields come first, with their names; the fields we added (max_norm, the validation set,
reputation_decay, noise_seed, norm_screen_ratio) follow. docs/soup.md explains each one with the formulas it enters.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from gym.core.errors import ConfigError
from gym.core.names import did_you_mean
from gym.core.options import strict_fields, unknown_field
from gym.soup.aggregators import AggregationMethod
from gym.soup.screen import NORM_RATIO

# Methods built on Krum scores: they take byzantine_threshold's f and need n >= 2f + 3 contributions.
KRUM_FAMILY = (AggregationMethod.KRUM, AggregationMethod.MULTI_KRUM, AggregationMethod.BYZANTINE_ROBUST)


@strict_fields
@dataclass
class DeltaSoupConfig:
    """A soup's options. Defaults make a robust, non-private soup that rewards contributors."""

    method: AggregationMethod | str = AggregationMethod.BYZANTINE_ROBUST
    """How a round's accepted deltas are merged: mean, weighted_mean, median, trimmed_mean, krum, multi_krum,
    geometric_median or byzantine_robust (see gym.soup.aggregators)."""
    trim_percent: float = 0.1
    """trimmed_mean: the share of values cut from EACH end of every coordinate, in [0, 0.5)."""
    byzantine_threshold: float | None = None
    """krum, multi_krum, byzantine_robust (which filter by Krum scores): the share of a round's contributors
    assumed malicious, in [0, 0.5); f = floor(byzantine_threshold * n). None: f = floor((n - 3) / 2), the most
    Krum tolerates (n >= 2f + 3), which is also the most defensive."""
    differential_privacy: bool = False
    """Clip every contribution to clip_norm and add Gaussian noise to the aggregate, calibrated to
    (privacy_epsilon, privacy_delta) for one round; the ledger adds the rounds up."""
    privacy_epsilon: float = 1.0
    """Per-round epsilon of the Gaussian mechanism (smaller: more noise, more privacy)."""
    privacy_delta: float = 1e-5
    """Per-round delta of the Gaussian mechanism: the probability the epsilon bound may fail."""
    clip_norm: float = 1.0
    """With differential_privacy: each contribution's whole-model L2 norm is scaled down to at most this."""
    validate_contributions: bool = True
    """Check each contribution before accepting it: its norm against max_norm and, when validation_dataset
    is set, its validation loss against quality_threshold. Structural checks (base, shapes, finite values)
    always run: an aggregate of mismatched tensors has no meaning."""
    quality_threshold: float = 0.05
    """With a validation set: reject a contribution when base + it alone has validation loss above
    base_loss * (1 + quality_threshold). 0.05 tolerates a 5% worse loss (a fine-tune on other data may be
    a little worse on ours); 0 demands no harm; negative demands an improvement."""
    min_contributors: int = 3
    """aggregate() refuses to close a round with fewer accepted contributions."""
    max_contributors: int = 100
    """Accepted contributions per round; later ones in a full round are rejected ('round full'), not queued."""
    enable_rewards: bool = True
    """Split reward_pool among each round's selected contributors (see gym.soup.payouts)."""
    reward_pool: float = 1000.0
    """What one round pays out in total (when anybody earns)."""
    quality_weight: float = 0.7
    """The share of the pool paid by quality (agreement with the round's aggregate)."""
    participation_weight: float = 0.3
    """The share of the pool paid equally to every selected contributor."""
    use_bitdelta: bool = False
    """Store contributions 1-bit compressed (BitDelta signs + one scale per matrix, ~1/32 of float32) and
    decode them for aggregation; norms, validation and clipping see the decoded delta, i.e. what is merged."""

    max_norm: float | None = None
    """With validate_contributions: reject a contribution whose whole-model L2 norm exceeds this (None: no
    bound; the robust aggregators and clipping still limit what a large delta can do)."""
    validation_dataset: str | None = None
    """A Gym dataset name (dataset_info.json) or file for the validation-loss check; None: no such check."""
    validation_dataset_dir: str = "data"
    """Where dataset_info.json lives for validation_dataset (and safety_gate) names."""
    validation_max_samples: int = 32
    """Rows of the validation set used (the check runs one forward pass over them per contribution)."""
    validation_cutoff_len: int = 256
    """Tokens per validation row."""
    reputation_decay: float = 0.9
    """Reputation is an exponential moving average of quality: r <- decay * r + (1 - decay) * q each round."""
    noise_seed: int | None = None
    """Seed of the privacy noise. None (use this): fresh OS randomness. A fixed seed makes the noise
    predictable, which voids the privacy guarantee: for tests and reproducible benchmarks only."""
    safety_gate: str | None = None
    """With validate_contributions: a safety set (safety_demo, advbench, a file; names read from
    validation_dataset_dir). The base and base + contribution answer its harmful requests; a contribution whose
    harmful compliance rises more than safety_max_rise above the base's, or significantly (McNemar p < 0.05), is
    rejected with the numbers (gym.safety.gate). None: no safety check."""
    safety_judge: str = "refusal"
    """Who judges compliance for safety_gate: refusal (a string match) or a guard spec (keywords:FILE, ...)."""
    safety_max_rise: float = 0.05
    """The largest rise in harmful compliance safety_gate allows, as a share of the set's harmful requests."""
    safety_max_new_tokens: int = 64
    """Tokens per answer in the safety check."""
    norm_screen_ratio: float = NORM_RATIO
    """Before any aggregator: a contribution whose whole-model L2 norm is more than this many times the round's
    median norm, or less than the median over it, is excluded from the round (with the reason) and earns
    nothing (gym.soup.screen). Under differential_privacy, mean, weighted_mean and trimmed_mean skip it:
    clipping bounds every contribution's size there."""

    def __post_init__(self) -> None:
        self._check_types()
        try:
            self.method = AggregationMethod(self.method)
        except ValueError:
            choices = ", ".join(m.value for m in AggregationMethod)
            raise ConfigError(f"Unknown aggregation method {self.method!r}; choose one of {choices}."
                              f"{did_you_mean(str(self.method), [m.value for m in AggregationMethod])}") from None
        _in_range("trim_percent", self.trim_percent, 0.0, 0.5, high_open=True)
        if self.byzantine_threshold is not None:
            _in_range("byzantine_threshold", self.byzantine_threshold, 0.0, 0.5, high_open=True)
        _positive("clip_norm", self.clip_norm)
        if self.differential_privacy:
            _positive("privacy_epsilon", self.privacy_epsilon)
            _in_range("privacy_delta", self.privacy_delta, 0.0, 1.0, low_open=True, high_open=True)
        if self.quality_threshold <= -1:
            raise ConfigError(f"quality_threshold must be > -1 (a relative change of loss), got "
                              f"{self.quality_threshold}.")
        if self.min_contributors < 1:
            raise ConfigError(f"min_contributors must be at least 1, got {self.min_contributors}.")
        if self.method in KRUM_FAMILY and self.min_contributors < 3:
            raise ConfigError(f"{self.method.value} scores contributions by their Krum neighbourhoods and needs "
                              "at least 3 per round (n >= 2f + 3); set min_contributors >= 3, or choose mean, median "
                              "or geometric_median for smaller rounds.")
        if self.max_contributors < self.min_contributors:
            raise ConfigError(f"max_contributors ({self.max_contributors}) is below min_contributors "
                              f"({self.min_contributors}): no round could ever be aggregated.")
        for name in ("reward_pool", "quality_weight", "participation_weight"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}.")
        if self.enable_rewards and self.quality_weight + self.participation_weight == 0:
            raise ConfigError("quality_weight and participation_weight are both 0: rewards would split nothing; "
                              "set one of them, or enable_rewards=False.")
        if self.max_norm is not None:
            _positive("max_norm", self.max_norm)
        if self.validation_max_samples < 1 or self.validation_cutoff_len < 1:
            raise ConfigError("validation_max_samples and validation_cutoff_len must be positive.")
        _in_range("reputation_decay", self.reputation_decay, 0.0, 1.0, high_open=True)
        if self.safety_gate is not None:
            self.gate()  # its own checks: max_rise in [0, 1), max_new_tokens >= 1, a judge
        if not self.norm_screen_ratio > 1:
            raise ConfigError(f"norm_screen_ratio must be above 1 (a factor around the median norm), got "
                              f"{self.norm_screen_ratio!r}.")

    def _check_types(self) -> None:
        """Each field's kind, before any comparison: `min_contributors=abc` from the command line used to end in a
        TypeError traceback, and `differential_privacy=maybe` was taken as true."""
        for name in _BOOLS:
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}.")
        for name in _WHOLE:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{name} must be a whole number, got {value!r}.")
        for name in _NUMBERS:
            value = getattr(self, name)
            if value is None and name in _OPTIONAL:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"{name} must be a finite number{' or null' if name in _OPTIONAL else ''}, "
                                  f"got {value!r}.")
        seed = self.noise_seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
            # torch seeds take up to 2^64 - 1, and the round id is added to this one.
            raise ConfigError(f"noise_seed must be null or a whole number from 0 to 2^63 - 1, got {seed!r}.")
        for name in ("validation_dataset", "validation_dataset_dir", "safety_gate", "safety_judge"):
            value = getattr(self, name)
            if not (isinstance(value, str) or (value is None and name in ("validation_dataset", "safety_gate"))):
                raise ConfigError(f"{name} must be a string, got {value!r}.")

    def gate(self) -> Any:
        """The safety gate safety_gate asks for (gym.safety.gate.SafetyGate), or None."""
        if self.safety_gate is None:
            return None
        from gym.safety.gate import SafetyGate

        return SafetyGate(self.safety_gate, judge=self.safety_judge, max_rise=self.safety_max_rise,
                          max_new_tokens=self.safety_max_new_tokens, dataset_dir=self.validation_dataset_dir)

    def num_byzantine(self, n: int) -> int | None:
        """Krum's f for n contributors; None: the aggregator's default, floor((n - 3) / 2)."""
        return None if self.byzantine_threshold is None else math.floor(self.byzantine_threshold * n)

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        values["method"] = AggregationMethod(self.method).value
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> DeltaSoupConfig:
        known = [f.name for f in fields(cls)]
        unknown = sorted(str(key) for key in values if key not in known)
        if unknown:  # the constructor says the same, but only of string keys: YAML may hold others
            raise unknown_field(cls.__name__, unknown, known)
        return cls(**values)


_BOOLS = ("differential_privacy", "validate_contributions", "enable_rewards", "use_bitdelta")
_WHOLE = ("min_contributors", "max_contributors", "validation_max_samples", "validation_cutoff_len",
          "safety_max_new_tokens")
_NUMBERS = ("trim_percent", "byzantine_threshold", "privacy_epsilon", "privacy_delta", "clip_norm",
            "quality_threshold", "reward_pool", "quality_weight", "participation_weight", "max_norm",
            "reputation_decay", "norm_screen_ratio", "safety_max_rise")
_OPTIONAL = ("byzantine_threshold", "max_norm")


def _positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ConfigError(f"{name} must be a positive number, got {value!r}.")


def _in_range(name: str, value: float, low: float, high: float, low_open: bool = False,
              high_open: bool = False) -> None:
    ok = isinstance(value, (int, float)) and (value > low if low_open else value >= low) and \
        (value < high if high_open else value <= high)
    if not ok:
        raise ConfigError(f"{name} must be in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}, "
                          f"got {value!r}.")
