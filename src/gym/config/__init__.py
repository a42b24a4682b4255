"""Configuration: one dataclass per concern, and the strict parser that fills them."""

from gym.config.data import DataArguments
from gym.config.finetuning import FinetuningArguments
from gym.config.generating import GeneratingArguments
from gym.config.model import ModelArguments
from gym.config.parser import (
    TrainArgs,
    get_infer_args,
    get_train_args,
    load_config_file,
    parse_cli_args,
)
from gym.config.training import TrainingArguments

__all__ = [
    "DataArguments",
    "FinetuningArguments",
    "GeneratingArguments",
    "ModelArguments",
    "TrainArgs",
    "TrainingArguments",
    "get_infer_args",
    "get_train_args",
    "load_config_file",
    "parse_cli_args",
]
