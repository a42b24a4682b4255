"""YAML/JSON/dict + CLI overrides -> the five argument dataclasses.

Strict on purpose: an unknown key is an error that names the closest valid key, and a value of the
wrong type says what was expected. LLaMA-Factory configs load unchanged; the seeds' spellings
(`model:`, `algorithm:`) are aliases.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import json
import os
import types
import typing
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, NamedTuple, Union

import yaml

from gym.config.data import DataArguments
from gym.config.finetuning import FinetuningArguments
from gym.config.generating import GeneratingArguments
from gym.config.model import ModelArguments
from gym.config.training import TrainingArguments
from gym.errors import ConfigError

# Other spellings users bring: the seeds' own, and LLaMA-Factory keys that transformers 5 renamed.
ALIASES: dict[str, str] = {
    "model": "model_name_or_path",
    "algorithm": "stage",
    "warmup_ratio": "warmup_steps",  # transformers 5: warmup_steps < 1 is a ratio
    "group_by_length": "train_sampling_strategy",
}

CONCERNS: dict[str, type] = {
    "model": ModelArguments,
    "data": DataArguments,
    "training": TrainingArguments,
    "finetuning": FinetuningArguments,
    "generating": GeneratingArguments,
}


class TrainArgs(NamedTuple):
    """The parsed config, in the order the seeds unpack it."""

    model: ModelArguments
    data: DataArguments
    training: TrainingArguments
    finetuning: FinetuningArguments
    generating: GeneratingArguments


@lru_cache(maxsize=None)
def _fields(cls: type) -> dict[str, tuple[Any, dataclasses.Field]]:
    hints = typing.get_type_hints(cls)
    return {f.name: (hints[f.name], f) for f in dataclasses.fields(cls) if f.init}


def _method_option_classes() -> dict[str, type]:
    from gym.train.methods import METHODS

    return {name: m.options for name, m in METHODS.items() if m.options is not None}


def known_keys() -> dict[str, type]:
    """Every accepted key -> the dataclass that owns it (for a key several methods share, the first)."""
    keys: dict[str, type] = {}
    for cls in CONCERNS.values():
        for name in _fields(cls):
            keys.setdefault(name, cls)
    for cls in _method_option_classes().values():
        for name in _fields(cls):
            keys.setdefault(name, cls)
    return keys


def _stages_reading(key: str) -> list[str]:
    return sorted(stage for stage, cls in _method_option_classes().items() if key in _fields(cls))


def _suggest(key: str, candidates: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(candidates), n=1, cutoff=0.6)
    return f" Did you mean '{close[0]}'?" if close else " Run `gym train --help` for the list of keys."


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp) if a is not type(None))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of " + ", ".join(repr(m.value) for m in tp)
    plain = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return plain.get(tp, getattr(tp, "__name__", str(tp)))


_BOOL_WORDS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}


def coerce(key: str, value: Any, tp: Any) -> Any:
    """Convert `value` to the field type `tp`, or raise a ConfigError that says what was expected."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        members = typing.get_args(tp)
        if value is None and type(None) in members:
            return None
        if isinstance(value, str) and value in ("None", "null", "Null", "NULL") and type(None) in members:
            return None
        # Prefer an exact type match before trying conversions (so "8" stays a str for `int | str`).
        for member in members:
            if member is not type(None) and isinstance(member, type) and not issubclass(member, enum.Enum):
                if type(value) is member:
                    return value
        for member in members:
            if member is type(None):
                continue
            try:
                return coerce(key, value, member)
            except ConfigError:
                continue
        raise ConfigError(f"'{key}' expects {_type_name(tp)}, got {value!r}.")
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value in allowed:
            return value
        raise ConfigError(f"'{key}' expects {_type_name(tp)}, got {value!r}.{_suggest(str(value), map(str, allowed))}")
    if origin in (list, typing.List):
        (inner,) = typing.get_args(tp) or (Any,)
        items = value if isinstance(value, list) else [v for v in str(value).split(",") if v.strip()]
        return [coerce(key, v.strip() if isinstance(v, str) else v, inner) for v in items]
    if origin in (dict, typing.Dict) or tp is dict:
        if isinstance(value, dict):
            return value
        if isinstance(value, str):
            try:
                parsed = json.loads(value)
            except json.JSONDecodeError:
                parsed = None
            if isinstance(parsed, dict):
                return parsed
        raise ConfigError(f"'{key}' expects a mapping (YAML mapping or JSON object), got {value!r}.")
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _BOOL_WORDS:
            return _BOOL_WORDS[value.lower()]
        raise ConfigError(f"'{key}' expects true or false, got {value!r}.")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"'{key}' expects an integer, got {value!r}.")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise ConfigError(f"'{key}' expects an integer, got {value!r}.")
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"'{key}' expects a number, got {value!r}.")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)  # YAML 1.1 reads "1e-4" as a string; accept it as a number
            except ValueError:
                pass
        raise ConfigError(f"'{key}' expects a number, got {value!r}.")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return ",".join(value)  # `dataset: [a, b]` means `dataset: a,b`
        raise ConfigError(f"'{key}' expects a string, got {value!r}.")
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            choices = [m.value for m in tp]
            raise ConfigError(
                f"'{key}' expects {_type_name(tp)}, got {value!r}.{_suggest(str(value), map(str, choices))}"
            ) from None
    # Types we do not check (e.g. accelerate objects): hand them to the dataclass as they are.
    return value


def load_config_file(path: str | os.PathLike) -> dict[str, Any]:
    """Read a YAML or JSON config into a flat dict."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"Config file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of keys to values, not a {type(data).__name__}.")
    return data


def split_names(value: str | None) -> list[str]:
    """`"a, b,,c"` -> ["a", "b", "c"]: the comma-separated lists config keys hold (datasets, adapters, modules)."""
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def as_config_dict(config: dict[str, Any] | str | os.PathLike | None) -> dict[str, Any]:
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


def parse_cli_args(argv: list[str]) -> dict[str, Any]:
    """`[CONFIG] [key=value ...] [--key value ...] [--flag]` -> one flat dict (later wins)."""
    config: dict[str, Any] = {}
    overrides: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            body = arg[2:]
            if "=" in body:
                key, text = body.split("=", 1)
                overrides[key] = _parse_scalar(text)
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                overrides[body] = _parse_scalar(argv[i + 1])
                i += 1
            else:
                overrides[body] = True
        elif "=" in arg and not Path(arg).suffix.lower() in (".yaml", ".yml", ".json"):
            key, text = arg.split("=", 1)
            overrides[key] = _parse_scalar(text)
        elif Path(arg).suffix.lower() in (".yaml", ".yml", ".json"):
            config.update(load_config_file(arg))
        else:
            raise ConfigError(
                f"Unexpected argument {arg!r}: give a .yaml/.json config, key=value, or --key value."
            )
        i += 1
    config.update(overrides)
    return config


def _canonical(config: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        key = str(key).replace("-", "_")
        target = ALIASES.get(key, key)
        if key == "group_by_length":
            value = "group_by_length" if coerce(key, value, bool) else "random"
        elif key == "warmup_ratio":
            ratio = coerce(key, value, float)
            if not 0 <= ratio < 1:
                raise ConfigError(f"'warmup_ratio' expects a number in [0, 1), got {value!r}.")
            value = ratio
        if target in out and out[target] != value:
            raise ConfigError(f"'{key}' and '{target}' both set, to different values; keep one.")
        out[target] = value
    return out


def _build(cls: type, values: dict[str, Any]) -> Any:
    fields = _fields(cls)
    kwargs = {k: coerce(k, v, fields[k][0]) for k, v in values.items()}
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"Invalid {cls.__name__}: {exc}") from None


def _split_by_concern(config: dict[str, Any], stage: str, options: type | None) -> dict[type, dict[str, Any]]:
    """Key -> the dataclass that reads it: a concern, or the chosen method's own options."""
    keys = known_keys()
    option_fields = _fields(options) if options is not None else {}
    buckets: dict[type, dict[str, Any]] = {}
    for key, value in config.items():
        if key in option_fields:
            buckets.setdefault(options, {})[key] = value
        elif key in keys and keys[key] in CONCERNS.values():
            buckets.setdefault(keys[key], {})[key] = value
        elif key in keys:
            raise ConfigError(f"'{key}' applies to stage {'/'.join(_stages_reading(key))}, not '{stage}'.")
        else:
            raise ConfigError(f"Unknown config key '{key}'.{_suggest(key, list(keys) + list(ALIASES))}")
    return buckets


def get_train_args(config: dict[str, Any] | str | os.PathLike | None = None) -> TrainArgs:
    """Parse a training config (dict, or path to YAML/JSON) into the five argument dataclasses.

    The method's own options (e.g. `pref_beta` for dpo) are attached as `finetuning.method_options`.
    """
    config = _canonical(as_config_dict(config))
    from gym.train.methods import METHODS

    stage = str(config.get("stage", FinetuningArguments.stage))
    if stage not in METHODS:
        raise ConfigError(f"Unknown stage '{stage}'.{_suggest(stage, METHODS)} Available: {', '.join(sorted(METHODS))}.")
    method = METHODS[stage]
    buckets = _split_by_concern(config, stage, method.options)

    finetuning: FinetuningArguments = _build(FinetuningArguments, buckets.get(FinetuningArguments, {}))
    finetuning.method_options = (
        _build(method.options, buckets.get(method.options, {})) if method.options is not None else None
    )

    model: ModelArguments = _build(ModelArguments, buckets.get(ModelArguments, {}))
    data: DataArguments = _build(DataArguments, buckets.get(DataArguments, {}))
    generating: GeneratingArguments = _build(GeneratingArguments, buckets.get(GeneratingArguments, {}))

    training_values = dict(buckets.get(TrainingArguments, {}))
    if training_values.get("output_dir") is None:
        training_values["output_dir"] = default_output_dir(model, finetuning)
    if training_values.get("bf16") is None:
        from gym.train.resources import native_bf16

        training_values["bf16"] = not training_values.get("fp16") and native_bf16()
    if "use_cpu" not in training_values and not _has_accelerator():
        # Configs written for GPUs (bf16: true) should still run here; transformers refuses them
        # on a CPU-only machine unless told to use the CPU.
        training_values["use_cpu"] = True
    training: TrainingArguments = _build(TrainingArguments, training_values)

    _check_combinations(model, data, training, finetuning)
    return TrainArgs(model, data, training, finetuning, generating)


def get_infer_args(config: dict[str, Any] | str | os.PathLike | None = None) -> tuple[ModelArguments, DataArguments, FinetuningArguments, GeneratingArguments]:
    """Parse a config for chat/inference: model, data (template), finetuning and generation keys.

    Training-only keys are accepted (so the training YAML can be reused) and ignored.
    """
    args = get_train_args(config)
    return args.model, args.data, args.finetuning, args.generating


def _has_accelerator() -> bool:
    import torch

    return torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available()) or (
        torch.backends.mps.is_available())


def default_output_dir(model: ModelArguments, finetuning: FinetuningArguments) -> str:
    name = (model.model_name_or_path or "smollm2-135m").rstrip("/").split("/")[-1]
    return str(Path("saves") / name / finetuning.finetuning_type / finetuning.stage)


def _check_combinations(model, data, training, finetuning) -> None:
    if data.cutoff_len <= 0:
        raise ConfigError(f"'cutoff_len' must be positive, got {data.cutoff_len}.")
    if data.max_samples is not None and data.max_samples <= 0:
        raise ConfigError(f"'max_samples' must be positive, got {data.max_samples}.")
    if data.val_size < 0:
        raise ConfigError(f"'val_size' must be >= 0, got {data.val_size}.")
    if data.val_size and data.eval_dataset:
        raise ConfigError("Set either 'val_size' or 'eval_dataset', not both.")
    if finetuning.lora_rank <= 0:
        raise ConfigError(f"'lora_rank' must be positive, got {finetuning.lora_rank}.")
    if finetuning.finetuning_type != "lora":
        lora_only = [k for k in ("use_dora", "use_rslora", "pissa_init") if getattr(finetuning, k)]
        if finetuning.loraplus_lr_ratio is not None:
            lora_only.append("loraplus_lr_ratio")
        if lora_only:
            raise ConfigError(f"'{lora_only[0]}' needs finetuning_type: lora (got '{finetuning.finetuning_type}').")
    if finetuning.use_dora and finetuning.pissa_init:
        raise ConfigError("'use_dora' and 'pissa_init' cannot be combined; choose one LoRA initialisation.")
    if model.adapter_name_or_path and finetuning.finetuning_type != "lora":
        raise ConfigError("'adapter_name_or_path' needs finetuning_type: lora.")
    if training.bf16 and training.fp16:
        raise ConfigError("Set at most one of 'bf16' and 'fp16'.")
