"""What the seeds' nested blocks (`distributed:`, `quantization:`, `serving:`) share: each block's keys are
checked by name, and each becomes flat keys that must not contradict the ones the config sets itself."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gym.core.errors import ConfigError
from gym.core.names import did_you_mean


def block_of(config: dict[str, Any], name: str, keys: Sequence[str]) -> dict[str, Any]:
    """config[name] as a dict whose every key is one of `keys` (an unknown one names the closest)."""
    block = config.get(name) or {}
    if not isinstance(block, dict):
        raise ConfigError(f"'{name}' is a block of keys ({', '.join(keys)}), got {block!r}.")
    for key in block:
        if key not in keys:
            raise ConfigError(f"Unknown key '{name}.{key}'.{did_you_mean(str(key), keys)} It takes: "
                              f"{', '.join(keys)}.")
    return block


def set_flat(config: dict[str, Any], block_name: str, key: str, value: Any) -> None:
    """config[key] = value, unless the config already sets key to something else."""
    if key in config and config[key] != value:
        raise ConfigError(f"'{block_name}:' sets '{key}: {value}', and the config also has '{key}: {config[key]}'; "
                          "keep one.")
    config[key] = value
