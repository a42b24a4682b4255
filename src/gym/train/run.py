"""`run_exp`: the one entry point behind `gym train`, the Python API and the web UI."""

from __future__ import annotations

import os
from typing import Any

from gym.config.parser import TrainArgs, get_train_args
from gym.errors import ConfigError
from gym.train.method import RunResult


def run_exp(config: dict[str, Any] | str | os.PathLike | TrainArgs | None = None) -> RunResult:
    args = config if isinstance(config, TrainArgs) else get_train_args(config)
    from gym.train.methods import METHODS

    if args.finetuning.delta_compression and args.finetuning.stage == "rm":
        raise ConfigError("delta_compression applies to language models; a reward model (stage: rm) is not one.")
    result = METHODS[args.finetuning.stage].run(args)
    if args.finetuning.delta_compression:
        from gym.delta.from_training import compress_output

        path = compress_output(args, result.output_dir)
        result.metrics["delta_file"] = str(path)
    return result
