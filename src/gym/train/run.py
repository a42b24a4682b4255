"""`run_exp`: the one entry point behind `gym train`, the Python API and the web UI.

config -> the stage's method (from the registry) -> its run -> (optionally) the result as a delta.
"""

from __future__ import annotations

from typing import Any

from gym.config.args import TrainArgs
from gym.config.files import ConfigSource
from gym.config.methods import get_method
from gym.config.parser import get_train_args
from gym.core.results import RunResult
from gym.delta.from_training import compress_output


def run_exp(config: ConfigSource | TrainArgs[Any] = None) -> RunResult:
    args = get_train_args(config)
    result = get_method(args.finetuning.stage).run(args)
    if args.finetuning.delta_compression:
        result.metrics["delta_file"] = str(compress_output(args, result.output_dir))
    return result
