"""LLaMA-Factory's entry point: `get_train_args(dict)` -> (model, data, training, finetuning, generating), a plain
five-tuple, which `from gym.train import run_sft` (and each run_<stage>) takes back."""

from __future__ import annotations

from typing import Any

from gym.config import parser
from gym.config.files import ConfigSource
from gym.config.parser import get_infer_args
from gym.workflows.entry_points import LlamaFactoryArgs, as_llamafactory

__all__ = ["get_infer_args", "get_train_args"]


def get_train_args(config: ConfigSource = None, **_: Any) -> LlamaFactoryArgs:
    return as_llamafactory(parser.get_train_args(config))
