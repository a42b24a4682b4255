"""LLaMA-Factory's entry point: `get_train_args(dict)` -> (model, data, training, finetuning, generating), a plain
five-tuple, which `from gym.train import run_sft` (and each run_<stage>) takes back.

As LLaMA-Factory's, both functions also take a list of command-line strings, read as `gym train` reads its argv:
`["--model_name_or_path", "x", "--stage", "sft"]`, or `["config.yaml", "learning_rate=1e-4"]`."""

from __future__ import annotations

from typing import Any

from gym.config import parser
from gym.config.data import DataArguments
from gym.config.files import ConfigSource, parse_cli_args
from gym.config.finetuning import FinetuningArguments
from gym.config.generating import GeneratingArguments
from gym.config.model import ModelArguments
from gym.core.errors import ConfigError
from gym.workflows.entry_points import LlamaFactoryArgs, as_llamafactory

__all__ = ["get_infer_args", "get_train_args"]

Args = ConfigSource | list[str] | tuple[str, ...]


def _config(config: Args, model_folders: bool = False) -> ConfigSource:
    """A list or tuple of strings as argv, parsed as the CLI parses it; anything else as it is."""
    if not isinstance(config, (list, tuple)):
        return config
    if not all(isinstance(arg, str) for arg in config):
        raise ConfigError(f"A list of arguments holds strings, as a command line does (['--stage', 'sft'] or "
                          f"['config.yaml', 'key=value']), got {list(config)!r:.80}.")
    return parse_cli_args(list(config), model_folders=model_folders)


def get_train_args(config: Args = None, **_: Any) -> LlamaFactoryArgs:
    """As `gym train` reads its config: a dict, a YAML/JSON path, or its argv as a list."""
    return as_llamafactory(parser.get_train_args(_config(config)))


def get_infer_args(config: Args = None) -> tuple[ModelArguments, DataArguments, FinetuningArguments,
                                                 GeneratingArguments]:
    """As `gym chat` reads its config: a dict, a YAML/JSON path, or its argv as a list (a model folder may stand
    alone in it)."""
    return parser.get_infer_args(_config(config, model_folders=True))
