"""A config (YAML/JSON file, dict, CLI overrides) -> a validated `TrainArgs`.

Strict on purpose: an unknown key is an error that names the closest valid key, and a value of the
wrong type says what was expected. LLaMA-Factory configs load unchanged; the seeds' spellings
(`model:`, `algorithm:`) are aliases. Validation happens here, once, for every door: each concern
and the stage's options check themselves against the whole config (`validate(args)`), so a config
that cannot run is rejected before anything loads.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import typing
from functools import cache
from pathlib import Path
from typing import Any

from gym.config import compression, distributed, serving
from gym.config.args import TrainArgs
from gym.config.coerce import coerce
from gym.config.data import DataArguments
from gym.config.files import ConfigSource, as_config_dict
from gym.config.finetuning import FinetuningArguments
from gym.config.generating import GeneratingArguments
from gym.config.methods import get_method, option_classes
from gym.config.model import ModelArguments
from gym.config.optimizers import check_optim
from gym.config.training import TrainingArguments, training_defaults
from gym.config.unsupported import READ_ELSEWHERE, UNSUPPORTED
from gym.core.errors import ConfigError, IncompleteConfig
from gym.core.hardware import has_accelerator, native_bf16
from gym.core.names import did_you_mean

# Other spellings users bring: the seeds' own, and LLaMA-Factory keys that transformers 5 renamed.
ALIASES: dict[str, str] = {
    "model": "model_name_or_path",
    "algorithm": "stage",
    "warmup_ratio": "warmup_steps",  # transformers 5: warmup_steps < 1 is a ratio
    "group_by_length": "train_sampling_strategy",
    "enable_liger_kernel": "use_liger_kernel",  # LLaMA-Factory's name for Hugging Face's key
    "group_size": "num_generations",  # the seeds' name for GRPO's answers per prompt
}

SEQUENCE_PARALLEL = (
    "'{key}: {value}': sequence parallelism (one long sequence split across GPUs) is not in Gym yet. It would come "
    "from DeepSpeed-Ulysses (deepspeed.sequence.layer.DistributedAttention) or ring attention (the ring-flash-attn "
    "package) across several CUDA GPUs. For long sequences today: gradient checkpointing, shift_attn (LongLoRA) "
    "or a shorter cutoff_len; remove the key.")

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
    """Every accepted key -> the dataclass that owns it (for a key several methods share, the first)."""
    keys: dict[str, type] = {}
    for cls in [*CONCERNS.values(), *option_classes().values()]:
        for name in fields_of(cls):
            keys.setdefault(name, cls)
    return keys


def _stages_reading(key: str) -> list[str]:
    return sorted(stage for stage, cls in option_classes().items() if key in fields_of(cls))


def _canonical(config: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for raw_key, value in config.items():
        key = str(raw_key).replace("-", "_")
        target = ALIASES.get(key, key)
        if key == "gradient_checkpointing" and str(value).lower() == "auto":
            value = None  # unset: chosen by estimated memory (gym.train.memory)
        elif key == "group_by_length":
            value = "group_by_length" if coerce(key, value, bool) else "random"
        elif key in ("sequence_parallel", "sequence_parallel_size"):
            if value is None or value is False or (not isinstance(value, bool) and str(value).lower() in
                                                   ("false", "no", "off", "0", "1")):
                continue  # off (sequence_parallel_size 1 is off too): nothing to do
            raise ConfigError(SEQUENCE_PARALLEL.format(key=key, value=value))
        elif key == "quantization_method" and str(value).lower() == "bitsandbytes":
            value = "bnb"  # the package's own name, as the seeds write it
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
    fields = fields_of(cls)
    kwargs = {k: coerce(k, v, fields[k][0]) for k, v in values.items()}
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"Invalid {cls.__name__}: {exc}") from None


def _split_by_concern(config: dict[str, Any], stage: str, options: type | None) -> dict[type, dict[str, Any]]:
    """Key -> the dataclass that reads it: a concern, or the chosen method's own options."""
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
        elif key == "tune":
            raise ConfigError("'tune' declares a hyper-parameter search: run `gym tune CONFIG --trials N` "
                              "(gym train runs one config).")
        elif key in keys:
            raise ConfigError(f"'{key}' applies to stage {'/'.join(_stages_reading(key))}, not '{stage}'.")
        else:
            hint = " Run `gym train --help` for the list of keys."
            raise ConfigError(f"Unknown config key '{key}'.{did_you_mean(key, [*keys, *ALIASES], hint)}")
    return buckets


def get_train_args(config: ConfigSource | TrainArgs[Any] = None, *, complete: bool = True) -> TrainArgs[Any]:
    """Parse and validate a training config (dict, or path to YAML/JSON).

    complete=False accepts a config that lacks what its run needs (IncompleteConfig: GRPO's reward) and
    leaves what this machine needs (a GPU for GPU kernels, their packages) to the run: the Python door's
    TrainingConfig is built that way, so a config can be completed later, or written where it will not run.
    """
    if isinstance(config, TrainArgs):
        return config
    values = serving.expand(compression.expand(distributed.expand(_canonical(as_config_dict(config)))))
    stage = str(values.get("stage", FinetuningArguments.stage))
    method = get_method(stage)
    buckets = _split_by_concern(values, stage, method.options)

    model: ModelArguments = _build(ModelArguments, buckets.get(ModelArguments, {}))
    data: DataArguments = _build(DataArguments, buckets.get(DataArguments, {}))
    if model.rope_scaling is not None and model.model_max_length is None:
        model.model_max_length = data.cutoff_len  # LLaMA-Factory's default: stretch RoPE to the training length
    finetuning: FinetuningArguments = _build(FinetuningArguments, buckets.get(FinetuningArguments, {}))
    generating: GeneratingArguments = _build(GeneratingArguments, buckets.get(GeneratingArguments, {}))
    options = _build(method.options, buckets.get(method.options, {})) if method.options is not None else None
    training_defaults()  # built before the run's own TrainingArguments, the one that must set the process up last
    training: TrainingArguments = _build(TrainingArguments, _training_values(buckets, model, finetuning))

    args = TrainArgs(model, data, training, finetuning, generating, options)
    finetuning.stage_options = options
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


def check_environment(args: TrainArgs[Any]) -> None:
    for part in (args.model, args.data, args.training, args.finetuning, args.generating, args.options):
        check = getattr(part, "check_environment", None)
        if check is not None:
            check(args)


def _training_values(buckets: dict[type, dict[str, Any]], model: ModelArguments,
                     finetuning: FinetuningArguments) -> dict[str, Any]:
    """The user's training keys, with Gym's hardware-aware defaults filled in."""
    values = dict(buckets.get(TrainingArguments, {}))
    chosen = finetuning.chosen()
    if chosen and "optim" in values:
        raise ConfigError(f"'{chosen[0]}' and 'optim: {values['optim']}' both choose the optimizer; keep one.")
    values.update(finetuning.hf_optimizer())
    if values.get("deepspeed") and importlib.util.find_spec("deepspeed") is None:
        # Checked here: transformers refuses the key while building its arguments, with a packaging error.
        raise ConfigError("'deepspeed' needs the deepspeed package: pip install 'zoo-gym[deepspeed]' (then launch "
                          "with NPROC_PER_NODE=N gym train ..., docs/distributed.md).")
    if "optim" in values:
        check_optim(str(values["optim"]))
    if values.get("output_dir") is None:
        values["output_dir"] = default_output_dir(model, finetuning)
    if values.get("bf16") is None:
        values["bf16"] = not values.get("fp16") and not values.get("pure_bf16") and native_bf16()
    if "use_cpu" not in values and not has_accelerator():
        # Configs written for GPUs (bf16: true) should still run here; transformers refuses them
        # on a CPU-only machine unless told to use the CPU.
        values["use_cpu"] = True
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
