"""`run_exp`: the one entry point behind `gym train`, the Python API and the web UI."""

from __future__ import annotations

import os
from typing import Any

from gym.config.parser import TrainArgs, get_train_args
from gym.train.method import RunResult


def run_exp(config: dict[str, Any] | str | os.PathLike | TrainArgs | None = None) -> RunResult:
    args = config if isinstance(config, TrainArgs) else get_train_args(config)
    from gym.train.methods import METHODS

    return METHODS[args.finetuning.stage].run(args)
