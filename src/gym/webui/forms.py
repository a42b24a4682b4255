"""What the Train tab offers, read from the config dataclasses and the method registry (never a second list
of keys): the catalogue of every key with its help and default, a stage's own options as commented YAML,
and the config the form's values make, validated by the same parser `gym train` uses.
"""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path
from typing import Any

import yaml

from gym.config.coerce import type_name
from gym.config.help import field_default
from gym.config.parser import CONCERNS, fields_of, get_train_args
from gym.config.stages.registry import registered_stages
from gym.core.errors import ConfigError

# The keys the form shows as fields; every other key goes into "more keys" (YAML) and is listed in the catalogue.
FORM_KEYS = ("model_name_or_path", "stage", "finetuning_type", "dataset", "dataset_dir", "template",
             "learning_rate", "num_train_epochs", "max_steps", "per_device_train_batch_size",
             "gradient_accumulation_steps", "cutoff_len", "lora_rank", "logging_steps", "save_steps", "max_samples")
EMBEDDED_MODEL = "smollm2-135m"


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value if value is None or isinstance(value, (str, int, float, bool)) else str(value)


def _help(f: dataclasses.Field[Any]) -> str:
    return " ".join(str(f.metadata.get("help", "")).split())


def key_catalogue() -> list[list[str]]:
    """[key, section, type, default, help] for every key `gym train` accepts, sections in --help's order."""
    rows: list[list[str]] = []
    seen: set[str] = set()
    sections: list[tuple[str, type]] = list(CONCERNS.items())
    options: dict[type, list[str]] = {}
    for name, method in sorted(registered_stages().items()):
        if method.options is not None:
            options.setdefault(method.options, []).append(name)
    sections += [(f"{'/'.join(stages)} options", cls) for cls, stages in options.items()]
    for section, cls in sections:
        for key, (tp, f) in fields_of(cls).items():
            if key in seen:
                continue
            seen.add(key)
            rows.append([key, section, type_name(tp), repr(_plain(field_default(f))), _help(f)])
    return rows


def stage_options_yaml(stage: str) -> str:
    """The stage's own options with their defaults, each preceded by its help as a comment."""
    methods = registered_stages()
    method = methods.get(stage)
    if method is None or method.options is None:
        return f"# stage {stage} has no options of its own\n"
    lines = [f"# {stage} options, at their defaults: edit a value, or delete a line to keep the default"]
    options: type = method.options
    for key, (_, f) in fields_of(options).items():
        text = _help(f)
        if text:
            lines.append(f"# {text}")
        lines.append(yaml.safe_dump({key: _plain(field_default(f))}, default_flow_style=True, width=10_000)
                     .strip()[1:-1])
    return "\n".join(lines) + "\n"


def stages() -> list[tuple[str, str]]:
    """(label, stage) for the stage picker: the name, its data kind and summary."""
    return [(f"{name} · {m.data_kind.value} · {m.summary}", name) for name, m in sorted(registered_stages().items())]


def finetuning_types() -> list[str]:
    tp, _ = fields_of(CONCERNS["finetuning"])["finetuning_type"]
    return list(getattr(tp, "__args__", ("lora", "freeze", "full")))


def _yaml_mapping(text: str, what: str) -> dict[str, Any]:
    if not text.strip():
        return {}
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} is not valid YAML: {exc}") from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{what} must be YAML keys (key: value), got {type(value).__name__}.")
    return value


def train_config(form: dict[str, Any], options_yaml: str, more_yaml: str, output_dir: str) -> dict[str, Any]:
    """The YAML a run of this form is: the form's fields (blank ones left out), the stage's options that differ
    from their defaults, then "more keys"; validated exactly as `gym train` validates it."""
    config: dict[str, Any] = {}
    for key in FORM_KEYS:
        value = form.get(key)
        if value is None or value == "" or value == []:
            continue
        if isinstance(value, float) and value.is_integer() and key != "learning_rate" and key != "num_train_epochs":
            value = int(value)
        config[key] = ",".join(value) if isinstance(value, list) else value
    stage = str(config.get("stage", "sft"))
    method = registered_stages().get(stage)
    options: type | None = method.options if method is not None else None
    defaults = {k: _plain(field_default(f)) for k, (_, f) in fields_of(options).items()} if options else {}
    for key, value in _yaml_mapping(options_yaml, f"The {stage} options").items():
        if key not in defaults or value != defaults[key]:
            config[key] = value
    config.update(_yaml_mapping(more_yaml, "More keys"))
    config["output_dir"] = output_dir
    config.setdefault("logging_steps", 1)
    config.setdefault("plot_loss", True)
    config.setdefault("disable_tqdm", True)  # one log line per step reads better in the page than a bar
    get_train_args(dict(config))  # the parser's own errors (unknown key with "did you mean", bad values)
    return config


def local_models(search: list[Path]) -> list[str]:
    """Model folders found under `search` (finished Gym runs, and plain transformers folders), newest first."""
    found: list[tuple[float, str]] = []
    for root in search:
        if not root.is_dir():
            continue
        for marker in [*root.glob("**/gym_manifest.json"), *root.glob("*/config.json")]:
            folder = marker.parent
            if "checkpoint-" in folder.name or folder.name.startswith("."):
                continue
            found.append((marker.stat().st_mtime, str(folder)))
    unique = dict.fromkeys(path for _, path in sorted(found, reverse=True))
    return [EMBEDDED_MODEL, *unique]
