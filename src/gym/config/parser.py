"""A config (YAML/JSON file, dict, CLI overrides) -> a validated `TrainArgs`.

Strict on purpose: an unknown key is an error that names the closest valid key, and a value of the
wrong type says what was expected. LLaMA-Factory configs load unchanged; other spellings are translated
first (gym.config.aliases). Defaults that depend on the rest of the config are resolved before the parts
are built; then validation happens here, once, for every door: each concern and the stage's options check
themselves against the whole config (`validate(args)`), so a config that cannot run is rejected before
anything loads. Nothing here imports torch, transformers or the training job: reading a config is cheap.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

from gym.config import aliases, distributed
from gym.config.args import TrainArgs
from gym.config.coerce import coerce
from gym.config.data import DataArguments
from gym.config.files import ConfigSource, as_config_dict, flag_name
from gym.config.finetuning import FinetuningArguments
from gym.config.generating import GeneratingArguments
from gym.config.model import ModelArguments
from gym.config.optimizers import check_optim
from gym.config.stages.registry import Stage, get_stage, option_classes
from gym.config.training import TrainingArguments
from gym.config.unsupported import ONE_WAY, READ_ELSEWHERE, UNSUPPORTED, is_on
from gym.core.errors import ConfigError, IncompleteConfig
from gym.core.names import closest

CONCERNS: dict[str, type] = {
    "model": ModelArguments,
    "data": DataArguments,
    "training": TrainingArguments,
    "finetuning": FinetuningArguments,
    "generating": GeneratingArguments,
}

FieldInfo = tuple[Any, "dataclasses.Field[Any]"]


@cache
def fields_of(cls: type) -> dict[str, FieldInfo]:
    """A dataclass's settable fields: name -> (resolved type, field)."""
    hints = typing.get_type_hints(cls)
    return {f.name: (hints[f.name], f) for f in dataclasses.fields(cls) if f.init}


def known_keys() -> dict[str, type]:
    """Every accepted key -> the dataclass that owns it (for a key several stages share, the first)."""
    keys: dict[str, type] = {}
    for cls in [*CONCERNS.values(), *option_classes().values()]:
        for name in fields_of(cls):
            keys.setdefault(name, cls)
    return keys


def _stages_reading(key: str) -> list[str]:
    return sorted(stage for stage, cls in option_classes().items() if key in fields_of(cls))


def _build(cls: type, values: dict[str, Any]) -> Any:
    fields = fields_of(cls)
    kwargs = {k: coerce(k, v, fields[k][0]) for k, v in values.items()}
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"Invalid {cls.__name__}: {exc}") from None


# Keys get_train_args takes besides the dataclasses' fields: spellings and blocks that config/aliases and
# config/distributed turn into fields, and the LLaMA-Factory keys it answers with a sentence.
def _read_specially() -> set[str]:
    return {*aliases.KEY_ALIASES, *aliases.RECORDED_ONLY, aliases.SERVING_BLOCK, aliases.DELTA_BLOCK,
            distributed.BLOCK, "tune", "sequence_parallel", "sequence_parallel_size", *READ_ELSEWHERE, *UNSUPPORTED,
            *ONE_WAY}


def _unknown_key(key: str, options: Iterable[str] = ()) -> ConfigError:
    """The error for a key nothing reads: the closest of the config's keys and of the command's own `options`
    (flags such as --max_waiting, compared without their dashes and named with them)."""
    flags = {flag_name(option): option for option in options}
    hint = " Run `gym train --help` for the list of keys."
    if flags:
        hint = f" The command's own options: {', '.join(flags.values())}; `gym train --help` lists the config keys."
    match = closest(key, [*flags, *known_keys(), *aliases.KEY_ALIASES])
    if match is None:
        return ConfigError(f"Unknown config key '{key}'.{hint}")
    return ConfigError(f"Unknown config key '{key}'. Did you mean '{flags.get(match, match)}'?")


def check_keys(config: dict[str, Any], options: Iterable[str] = ()) -> None:
    """Refuse, before anything loads, a key of `config` that no part of a config reads (a misspelt flag of the
    command: `options` are its own, named in the suggestion). What the keys' values mean is checked later, by
    get_train_args, as before."""
    keys, special = known_keys(), _read_specially()
    for raw in config:
        key = str(raw).replace("-", "_")
        if key not in keys and key not in special:
            raise _unknown_key(str(raw), options)


def _split_by_concern(config: dict[str, Any], stage: str, options: type | None) -> dict[type, dict[str, Any]]:
    """Key -> the dataclass that reads it: a concern, or the chosen stage's own options."""
    keys = known_keys()
    option_fields = fields_of(options) if options is not None else {}
    concerns = set(CONCERNS.values())
    buckets: dict[type, dict[str, Any]] = {}
    for key, value in config.items():
        if options is not None and key in option_fields:
            buckets.setdefault(options, {})[key] = value
        elif key in keys and keys[key] in concerns:
            buckets.setdefault(keys[key], {})[key] = value
        elif key in READ_ELSEWHERE:
            raise ConfigError(f"'{key}' {READ_ELSEWHERE[key]}")
        elif key in UNSUPPORTED:
            raise ConfigError(f"'{key}' (a LLaMA-Factory key) is not supported: {UNSUPPORTED[key]}")
        elif key in ONE_WAY:
            runs_with, reason = ONE_WAY[key]
            if is_on(value) != runs_with:
                raise ConfigError(f"'{key}: {value}' (a LLaMA-Factory key) is not supported: {reason}")
        elif key == "tune":
            raise ConfigError("'tune' declares a hyper-parameter search: run `gym tune CONFIG --trials N` "
                              "(gym train runs one config).")
        elif key in keys:
            raise ConfigError(f"'{key}' applies to stage {'/'.join(_stages_reading(key))}, not '{stage}'.")
        else:
            raise _unknown_key(key)
    return buckets


def get_train_args(config: ConfigSource | TrainArgs[Any] = None, *, complete: bool = True) -> TrainArgs[Any]:
    """Parse and validate a training config (dict, or path to YAML/JSON).

    complete=False accepts a config that lacks what its run needs (IncompleteConfig: GRPO's reward) and
    leaves what this machine needs (a GPU for GPU kernels, their packages) to the run: the Python door's
    TrainingConfig is built that way, so a config can be completed later, or written where it will not run.
    """
    if isinstance(config, TrainArgs):
        return config
    values = distributed.expand(aliases.canonical(as_config_dict(config)))
    stage = get_stage(str(values.get("stage", FinetuningArguments.stage)))
    _fix_stage_options(values, stage)
    buckets = _split_by_concern(values, stage.name, stage.options)

    model: ModelArguments = _build(ModelArguments, buckets.get(ModelArguments, {}))
    data: DataArguments = _build(DataArguments, buckets.get(DataArguments, {}))
    if model.rope_scaling is not None and model.model_max_length is None:
        model.model_max_length = data.cutoff_len  # LLaMA-Factory's default: stretch RoPE to the training length
    finetuning: FinetuningArguments = _build(FinetuningArguments, buckets.get(FinetuningArguments, {}))
    generating: GeneratingArguments = _build(GeneratingArguments, buckets.get(GeneratingArguments, {}))
    options = _build(stage.options, buckets.get(stage.options, {})) if stage.options is not None else None
    training: TrainingArguments = _build(TrainingArguments, _training_values(buckets, model, data, finetuning))

    args = TrainArgs(model, data, training, finetuning, generating, options)
    for part in (model, data, training, finetuning, generating, options):
        validate = getattr(part, "validate", None)
        if validate is not None:
            try:
                validate(args)
            except IncompleteConfig:
                if complete:
                    raise
    if complete:
        check_environment(args)
    return args


def _fix_stage_options(values: dict[str, Any], stage: Stage[Any]) -> None:
    """A stage that stands for fixed option values (`stage: orpo` is dpo with `pref_loss: orpo`) sets them; the config
    may repeat them, not contradict them."""
    for key, value in stage.fixed.items():
        if key in values and values[key] != value:
            raise ConfigError(f"stage: {stage.name} uses {key} {value}; remove {key}: {values[key]} or use another "
                              "stage.")
        values[key] = value


def check_environment(args: TrainArgs[Any]) -> None:
    for part in (args.model, args.data, args.training, args.finetuning, args.generating, args.options):
        check = getattr(part, "check_environment", None)
        if check is not None:
            check(args)


def _training_values(buckets: dict[type, dict[str, Any]], model: ModelArguments, data: DataArguments,
                     finetuning: FinetuningArguments) -> dict[str, Any]:
    """The user's training keys, with the defaults that follow from the rest of the config. (Those that follow from
    the machine, bf16 and the CPU, are decided when the run starts: gym.train.hf_args.)"""
    values = dict(buckets.get(TrainingArguments, {}))
    chosen = finetuning.chosen()
    if chosen and "optim" in values:
        raise ConfigError(f"'{chosen[0]}' and 'optim: {values['optim']}' both choose the optimizer; keep one.")
    values.update(finetuning.hf_optimizer())
    if "optim" in values:
        check_optim(str(values["optim"]))
    if values.get("output_dir") is None:
        values["output_dir"] = default_output_dir(model, finetuning)
    if "eval_strategy" not in values and (data.val_size > 0 or data.eval_dataset):
        values["eval_strategy"] = "epoch"  # an evaluation set is given: evaluate on it
    return values


def get_infer_args(config: ConfigSource = None) -> tuple[ModelArguments, DataArguments, FinetuningArguments,
                                                          GeneratingArguments]:
    """Parse a config for chat/inference: model, data (template), finetuning and generation keys.

    Training-only keys are accepted (so the training YAML can be reused) and ignored, and so is what only
    training needs (GRPO's reward).
    """
    args = get_train_args(config, complete=False)
    check_environment(args)
    return args.model, args.data, args.finetuning, args.generating


def default_output_dir(model: ModelArguments, finetuning: FinetuningArguments) -> str:
    name = (model.model_name_or_path or "smollm2-135m").rstrip("/").split("/")[-1]
    return str(Path("saves") / name / finetuning.finetuning_type / finetuning.stage)
