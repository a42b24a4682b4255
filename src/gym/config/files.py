"""Where configs come from: YAML/JSON files, dicts, and `gym <verb>` arguments."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import yaml

from gym.config.aliases import without_overridden
from gym.core.errors import ConfigError

CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
_OVERRIDE = re.compile(r"^[A-Za-z_][\w.-]*=")  # `key=value`, whatever the value looks like

Config = dict[str, Any]
ConfigSource = Config | str | os.PathLike[str] | None


def load_config_file(path: str | os.PathLike[str]) -> Config:
    """Read a YAML or JSON config into a flat dict."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path} is a folder; a config is a YAML or JSON file (a model or a run folder is named "
                          "with model_name_or_path= or adapter_name_or_path=).")
    if not path.is_file():
        raise ConfigError(f"Config file not found: {path}")
    kind = "JSON" if path.suffix == ".json" else "YAML"
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a text file; a config is {kind} text.") from None
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}{_where(exc)}: not valid {kind} ({_why(exc)}).") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of keys to values, not a {type(data).__name__}.")
    return data


def _where(exc: yaml.YAMLError | json.JSONDecodeError) -> str:
    """', line L, column C' of a parse error (the parsers' own messages span several lines)."""
    if isinstance(exc, json.JSONDecodeError):
        return f", line {exc.lineno}, column {exc.colno}"
    mark = getattr(exc, "problem_mark", None)
    return "" if mark is None else f", line {mark.line + 1}, column {mark.column + 1}"


def _why(exc: yaml.YAMLError | json.JSONDecodeError) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return exc.msg
    problem, context = getattr(exc, "problem", None), getattr(exc, "context", None)
    if not problem:
        return " ".join(str(exc).split())
    why = str(problem)
    if context:  # e.g. "while parsing a flow sequence": where the unfinished thing began is the useful place
        mark = getattr(exc, "context_mark", None)
        where = "" if mark is None else f" that starts at line {mark.line + 1}, column {mark.column + 1}"
        why += f", {context}{where}"
    return " ".join(why.split())


def as_config_dict(config: ConfigSource) -> Config:
    """None, a dict, or a path to YAML/JSON -> a fresh dict the caller may change."""
    if config is None:
        return {}
    if isinstance(config, dict):
        return dict(config)
    if not isinstance(config, (str, os.PathLike)):  # a bare TypeError from pathlib, deep in the call, said less
        raise ConfigError(f"A config is a dict of keys or the path of a YAML/JSON file, got {type(config).__name__} "
                          f"{config!r:.60}.")
    return load_config_file(config)


def _parse_scalar(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def model_folder_keys(folder: Path) -> Config:
    """A folder named on the command line of a verb that loads a model (`gym chat saves/run`): a finished LoRA run
    or adapter -> adapter_name_or_path (its base is the one adapter_config.json names), a model folder (a full
    fine-tune, a merged export, a downloaded model) -> model_name_or_path."""
    if (folder / "adapter_config.json").is_file():
        return {"adapter_name_or_path": str(folder)}
    if (folder / "config.json").is_file():
        return {"model_name_or_path": str(folder)}
    raise ConfigError(f"{folder} is a folder, but neither a model (config.json) nor an adapter (adapter_config.json): "
                      "name a finished run's output_dir, a model folder, or a .yaml/.json config.")


def parse_cli_args(argv: list[str], *, model_folders: bool = False) -> Config:
    """`[CONFIG] [key=value ...] [--key value ...] [--flag]` -> one flat dict (later wins).

    `key=value` is always an override, even when the value is a path ending in .json or .yaml. `--config FILE`
    is another way to give CONFIG (LLaMA-Factory's `train --config` spelling). With model_folders (the verbs that
    load a model: chat, api, infer, eval, export), a folder or a model name may stand for the model (one of
    them): model_folder_keys."""
    config: Config = {}
    overrides: Config = {}
    folder_given: str | None = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            body = arg[2:]
            if body.startswith("config=") or (body == "config" and i + 1 < len(argv)):
                path = body.split("=", 1)[1] if "=" in body else argv[i + 1]
                i += 0 if "=" in body else 1
                config.update(load_config_file(path))
            elif "=" in body:
                key, text = body.split("=", 1)
                overrides[key] = _parse_scalar(text)
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                overrides[body] = _parse_scalar(argv[i + 1])
                i += 1
            else:
                overrides[body] = True
        elif _OVERRIDE.match(arg):
            key, text = arg.split("=", 1)
            overrides[key] = _parse_scalar(text)
        elif Path(arg).suffix.lower() in CONFIG_SUFFIXES:
            config.update(load_config_file(arg))
        elif model_folders and not arg.startswith("-"):
            if folder_given is not None:
                raise ConfigError(f"Two models given, {folder_given!r} and {arg!r}: name one.")
            folder_given = arg
            # a folder as model_folder_keys says; anything else a model name (`gym api smollm2-135m`, as vLLM's
            # `serve MODEL`), which the loader resolves or refuses with the names it knows
            folder = Path(arg).expanduser()
            overrides.update(model_folder_keys(folder) if folder.is_dir() else {"model_name_or_path": arg})
        else:
            what = "a .yaml/.json config, a model or run folder," if model_folders else "a .yaml/.json config,"
            raise ConfigError(f"Unexpected argument {arg!r}: give {what} key=value, or --key value.")
        i += 1
    config = without_overridden(config, overrides)
    config.update(overrides)
    return config


def flag_name(arg: str) -> str:
    """`--max-batch-size` and `--max_batch_size` -> "max_batch_size": the one name both spellings stand for (the
    documents write some flags with hyphens, LLaMA-Factory and transformers with underscores)."""
    return arg.lstrip("-").replace("-", "_")


def _is_flag(arg: str, name: str) -> bool:
    head = arg.split("=", 1)[0]
    dashes = len(name) - len(name.lstrip("-"))
    return head[:dashes] == "-" * dashes and head[dashes:dashes + 1] != "-" and flag_name(head) == flag_name(name)


def take_option(argv: list[str], name: str, default: str | None = None) -> tuple[str | None, list[str]]:
    """`--name value` (or `--name=value`, either spelling: flag_name) out of argv -> (value, the rest); (default,
    argv) when it is not there."""
    for i, arg in enumerate(argv):
        if not _is_flag(arg, name):
            continue
        if "=" in arg:
            return arg.split("=", 1)[1], argv[:i] + argv[i + 1:]
        if i + 1 >= len(argv):
            raise ConfigError(f"{name} needs a value.")
        return argv[i + 1], argv[:i] + argv[i + 2:]
    return default, argv


def take_flag(argv: list[str], name: str) -> tuple[bool, list[str]]:
    """Whether the switch `--name` (either spelling) is in argv, and argv without it."""
    rest = [arg for arg in argv if not (_is_flag(arg, name) and "=" not in arg)]
    return len(rest) != len(argv), rest
