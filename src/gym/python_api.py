"""The Python door: the same config and the same run as `gym train`, built from keyword arguments.

    from gym import Trainer, TrainingConfig
    result = Trainer(TrainingConfig(model="smollm2-135m", algorithm="sft", dataset="identity")).train()
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gym.config.args import TrainArgs
from gym.config.files import ConfigSource, as_config_dict
from gym.config.parser import get_train_args
from gym.core.results import RunResult
from gym.train.run import run_exp


class TrainingConfig:
    """Any `gym train` key as a keyword (`model=` and `algorithm=` are accepted too). Each key and value is
    checked at construction, with the CLI's errors; what the whole config needs (GRPO's reward, a dataset)
    and what the machine needs (a GPU for use_unsloth) are checked when training starts, so a config can be
    completed later (`Trainer.train(dataset=...)`) or written where it will not run."""

    def __init__(self, config: ConfigSource = None, **keys: Any) -> None:
        self.values: dict[str, Any] = {**as_config_dict(config), **keys}
        self.args: TrainArgs[Any] = get_train_args(self.values, complete=False)

    def replace(self, **keys: Any) -> TrainingConfig:
        return TrainingConfig({**self.values, **keys})

    def __repr__(self) -> str:
        return f"TrainingConfig({self.values!r})"


class Trainer:
    def __init__(self, config: TrainingConfig | ConfigSource) -> None:
        self.config = config if isinstance(config, TrainingConfig) else TrainingConfig(config)

    def train(self, dataset: str | None = None, **overrides: Any) -> RunResult:
        """Run the configured job; `dataset=` and other keys override the config for this run."""
        if dataset is not None:
            overrides["dataset"] = dataset
        config = self.config.replace(**overrides) if overrides else self.config
        return run_exp(config.values)

    def export(self, path: str | os.PathLike[str], format: str | None = None, quantization: str | None = None,
               **keys: Any) -> Path:
        """Export the trained run (this config's output_dir) as `format`: "hf" (a folder), "gguf" (the default for a
        path ending in .gguf), "gguf-lora". `quantization`: the GGUF type (f16, q8_0, q4_k_m, ...) or "bitdelta"
        (the fine-tune as its BitDelta variant serves it). More keys: those of `gym export` (docs/export.md)."""
        from gym.export.run import run_export

        chosen = format or ("gguf" if str(path).endswith(".gguf") else "hf")
        config = {"output_dir": self.config.args.output_dir, "export_dir": str(path), "export_format": chosen,
                  "export_quantization": quantization, **keys}
        return run_export(config)
