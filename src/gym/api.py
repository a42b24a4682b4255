"""The Python API: the same config and the same run as `gym train`, built from keyword arguments."""

from __future__ import annotations

import os
from typing import Any

from gym.config.parser import TrainArgs, as_config_dict, get_train_args
from gym.train.method import RunResult


class TrainingConfig:
    """Any `gym train` key as a keyword (`model=` and `algorithm=` are accepted too). Validated at
    construction, with the same errors as the CLI."""

    def __init__(self, config: dict[str, Any] | str | os.PathLike | None = None, **keys: Any) -> None:
        self.values: dict[str, Any] = {**as_config_dict(config), **keys}
        self.args: TrainArgs = get_train_args(self.values)

    def replace(self, **keys: Any) -> "TrainingConfig":
        return TrainingConfig({**self.values, **keys})

    def __repr__(self) -> str:
        return f"TrainingConfig({self.values!r})"


class Trainer:
    def __init__(self, config: TrainingConfig | dict[str, Any] | str | os.PathLike) -> None:
        self.config = config if isinstance(config, TrainingConfig) else TrainingConfig(config)

    def train(self, dataset: str | None = None, **overrides: Any) -> RunResult:
        """Run the configured job; `dataset=` and other keys override the config for this run."""
        from gym.train.run import run_exp

        if dataset is not None:
            overrides["dataset"] = dataset
        config = self.config.replace(**overrides) if overrides else self.config
        return run_exp(config.args)
