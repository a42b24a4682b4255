"""The `tune:` section of a config: which keys to search and over what.

    tune:
      learning_rate: {low: 1.0e-5, high: 1.0e-3, log: true}   # a range (float, or int when both ends are)
      lora_rank: [8, 16, 32]                                  # a choice
      warmup_steps: {low: 0, high: 20, step: 5}

Every key must be one `gym train` accepts; a range needs low < high.
"""

from __future__ import annotations

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
            if not spec:
                raise ConfigError(f"tune: '{key}' lists no choices.")
            dimensions.append(Dimension(key, choices=tuple(spec)))
            continue
        if not isinstance(spec, dict) or not {"low", "high"} <= set(spec):
            raise ConfigError(f"tune: '{key}' needs a list of choices or {{low: ..., high: ...}} "
                              f"(optionally log: true, step: ...), got {spec!r}.")
        unknown = set(spec) - {"low", "high", "log", "step"}
        if unknown:
            raise ConfigError(f"tune: '{key}' has unknown field(s) {', '.join(sorted(unknown))}; "
                              "use low, high, log, step.")
        low, high = _number(spec["low"]), _number(spec["high"])
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low, high)) or low >= high:
            raise ConfigError(f"tune: '{key}' needs numbers low < high, got low={low!r}, high={high!r}.")
        if spec.get("log") and low <= 0:
            raise ConfigError(f"tune: '{key}' has log: true, which needs low > 0 (got {low}).")
        step = _number(spec["step"]) if spec.get("step") is not None else None
        dimensions.append(Dimension(key, low=low, high=high, log=bool(spec.get("log", False)), step=step))
    return dimensions


def _number(value: Any) -> Any:
    """YAML reads 1e-5 (no dot) as a string; ranges are numbers."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value
