"""The `tune:` section of a config: which keys to search and over what.

    tune:
      learning_rate: {low: 1.0e-5, high: 1.0e-3, log: true}   # a range (float, or int when both ends are)
      lora_rank: [8, 16, 32]                                  # a choice
      warmup_steps: {low: 0, high: 20, step: 5}

Every key must be one `gym train` accepts; a range needs finite numbers low < high, a step above 0 (whole for a
range of whole numbers, none with log: true), and a choice is a number, a string, true/false or null.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gym.config.aliases import KEY_ALIASES
from gym.config.parser import known_keys
from gym.core.errors import ConfigError
from gym.core.names import did_you_mean


@dataclass(frozen=True)
class Dimension:
    """One searched key: a range (low, high, log, step) or a list of choices."""

    key: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] | None = None

    @property
    def is_int(self) -> bool:
        return isinstance(self.low, int) and isinstance(self.high, int) and not isinstance(self.low, bool)

    def suggest(self, trial: Any) -> Any:
        """The value an Optuna trial picks for this key."""
        if self.choices is not None:
            return trial.suggest_categorical(self.key, list(self.choices))
        assert self.low is not None and self.high is not None
        if self.is_int:
            return trial.suggest_int(self.key, int(self.low), int(self.high), step=int(self.step or 1), log=self.log)
        return trial.suggest_float(self.key, float(self.low), float(self.high), step=self.step, log=self.log)

    def distribution(self) -> Any:
        """The Optuna distribution `suggest` samples from (what a study records for this key)."""
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.choices is not None:
            return CategoricalDistribution(list(self.choices))
        assert self.low is not None and self.high is not None
        if self.is_int:
            return IntDistribution(int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return FloatDistribution(float(self.low), float(self.high), log=self.log, step=self.step)


def describe(distribution: Any) -> str:
    """An Optuna distribution as the `tune:` section would write it."""
    choices = getattr(distribution, "choices", None)
    if choices is not None:
        return f"choices {list(choices)}"
    log = ", log: true" if distribution.log else ""
    whole_default = type(distribution.step) is int and distribution.step == 1  # an int range's implicit step
    step = "" if distribution.step is None or whole_default else f", step: {distribution.step}"
    return f"a range {{low: {distribution.low}, high: {distribution.high}{log}{step}}}"


def parse_space(section: Any) -> list[Dimension]:
    if not isinstance(section, dict) or not section:
        raise ConfigError("'tune' must map config keys to ranges or choices, e.g. "
                          "tune: {learning_rate: {low: 1.0e-5, high: 1.0e-3, log: true}, lora_rank: [8, 16]}.")
    keys = known_keys()
    dimensions = []
    for key, spec in section.items():
        key = KEY_ALIASES.get(str(key), str(key))
        if key not in keys:
            raise ConfigError(f"tune: unknown config key '{key}'.{did_you_mean(key, list(keys))}")
        if isinstance(spec, list):
            dimensions.append(Dimension(key, choices=_choices(key, spec)))
            continue
        if not isinstance(spec, dict) or not {"low", "high"} <= set(spec):
            raise ConfigError(f"tune: '{key}' needs a list of choices or {{low: ..., high: ...}} "
                              f"(optionally log: true, step: ...), got {spec!r}.")
        unknown = set(spec) - {"low", "high", "log", "step"}
        if unknown:
            raise ConfigError(f"tune: '{key}' has unknown field(s) {', '.join(sorted(unknown))}; "
                              "use low, high, log, step.")
        low, high = _number(spec["low"]), _number(spec["high"])
        if not all(_is_finite(v) for v in (low, high)) or low >= high:
            raise ConfigError(f"tune: '{key}' needs numbers low < high, got low={low!r}, high={high!r}.")
        log = False if spec.get("log") is None else spec["log"]
        if not isinstance(log, bool):
            raise ConfigError(f"tune: '{key}': log is true or false, got {log!r}.")
        if log and low <= 0:
            raise ConfigError(f"tune: '{key}' has log: true, which needs low > 0 (got {low}).")
        step = _step(key, spec.get("step"), low, high, log)
        dimensions.append(Dimension(key, low=low, high=high, log=log, step=step))
    return dimensions


def _choices(key: str, spec: list[Any]) -> tuple[Any, ...]:
    """Optuna stores each choice in its database: a number, a string, true/false or null, nothing else."""
    if not spec:
        raise ConfigError(f"tune: '{key}' lists no choices.")
    for choice in spec:
        if not (choice is None or isinstance(choice, (bool, str)) or _is_finite(choice)):
            raise ConfigError(f"tune: '{key}': each choice is a number, a string, true/false or null, got "
                              f"{choice!r}. For a list-valued key, give each list as one comma-separated string.")
    return tuple(spec)


def _step(key: str, value: Any, low: float, high: float, log: bool) -> float | None:
    """The grid a range is searched on: a number above 0 (NaN and "abc" are not), whole for a whole-number range."""
    if value is None:
        return None
    step = _number(value)
    if not _is_finite(step) or step <= 0:
        raise ConfigError(f"tune: '{key}': step must be a number above 0, got {value!r}.")
    if log:
        raise ConfigError(f"tune: '{key}': step and log: true do not go together (Optuna samples a log range "
                          "continuously); drop one of them.")
    if isinstance(low, int) and isinstance(high, int) and step != int(step):
        raise ConfigError(f"tune: '{key}' is a range of whole numbers ({low} to {high}), so step must be whole too, "
                          f"got {value!r}.")
    return step


def _is_finite(value: Any) -> bool:
    """A real number, not NaN or infinite (YAML's .nan and .inf read as floats, and NaN fails every comparison)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _number(value: Any) -> Any:
    """YAML reads 1e-5 (no dot) as a string; ranges are numbers."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value
