"""Where configs come from: YAML/JSON files, dicts, and `gym <verb>` arguments."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import yaml

from gym.core.errors import ConfigError

CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
_OVERRIDE = re.compile(r"^[A-Za-z_][\w.-]*=")  # `key=value`, whatever the value looks like

Config = dict[str, Any]
ConfigSource = Config | str | os.PathLike[str] | None


def load_config_file(path: str | os.PathLike[str]) -> Config:
    """Read a YAML or JSON config into a flat dict."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"Config file not found: {path}")
    kind = "JSON" if path.suffix == ".json" else "YAML"
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a text file; a config is {kind} text.") from None
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path} is not valid {kind}: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of keys to values, not a {type(data).__name__}.")
    return data


def as_config_dict(config: ConfigSource) -> Config:
    """None, a dict, or a path to YAML/JSON -> a fresh dict the caller may change."""
    if config is None:
        return {}
    if isinstance(config, dict):
        return dict(config)
    return load_config_file(config)


def _parse_scalar(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def parse_cli_args(argv: list[str]) -> Config:
    """`[CONFIG] [key=value ...] [--key value ...] [--flag]` -> one flat dict (later wins).

    `key=value` is always an override, even when the value is a path ending in .json or .yaml. `--config FILE`
    is another way to give CONFIG (LLaMA-Factory's `train --config` spelling)."""
    config: Config = {}
    overrides: Config = {}
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
        else:
            raise ConfigError(f"Unexpected argument {arg!r}: give a .yaml/.json config, key=value, or --key value.")
        i += 1
    config.update(overrides)
    return config


def take_option(argv: list[str], name: str, default: str | None = None) -> tuple[str | None, list[str]]:
    """`--name value` out of argv -> (value, the rest); (default, argv) when it is not there."""
    if name not in argv:
        return default, argv
    i = argv.index(name)
    if i + 1 >= len(argv):
        raise ConfigError(f"{name} needs a value.")
    return argv[i + 1], argv[:i] + argv[i + 2:]
