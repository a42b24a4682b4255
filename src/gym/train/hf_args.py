"""The run's Hugging Face `TrainingArguments` (or a TRL config, which is one), built once when a run starts from the
validated config (gym.config.training) and what this machine decides.

The config is never changed after it is validated. What the run decides later, bf16 where the hardware has it, the CPU
when there is no accelerator, pinned memory only with an accelerator, and gradient checkpointing once the model and
batch are known (gym.train.workflow.choose_checkpointing), lives in this object, which the Trainer reads. Only values
that differ from Hugging Face's defaults are passed, so transformers' own defaults and __post_init__ apply as usual.
Building one resets accelerate's process-wide state; the last one built (the method's, for a TRL trainer) is the one
the Trainer runs with.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch

from gym.config.args import TrainArgs
from gym.config.hf_training_fields import HFTrainingFields
from gym.config.training import GYM_ONLY_KEYS
from gym.core.errors import ConfigError
from gym.core.hardware import has_accelerator, native_bf16


def machine_values(args: TrainArgs[Any]) -> dict[str, Any]:
    """The training keys the config leaves to the machine, decided here."""
    training = args.training
    values: dict[str, Any] = {}
    if training.bf16 is None:
        values["bf16"] = not training.fp16 and not training.pure_bf16 and native_bf16()
    if training.use_cpu is None:
        # Configs written for GPUs (bf16: true) should still run here; transformers refuses them on a CPU-only
        # machine unless told to use the CPU.
        values["use_cpu"] = not has_accelerator()
    if not torch.cuda.is_available():
        values["dataloader_pin_memory"] = False  # pinning needs an accelerator; it only warns on CPU
    finetuning = args.finetuning
    if (training.ddp_find_unused_parameters is None and finetuning.finetuning_type == "lora"
            and finetuning.freeze_vision_tower and finetuning.freeze_multi_modal_projector):
        # transformers asks DDP to look for unused parameters whenever the model is not a PreTrainedModel (a PEFT
        # model never is): an extra pass over the autograd graph every step, and a warning from every rank. Every
        # LoRA weight of a text model takes part in each forward pass, as LLaMA-Factory also assumes; a trainable
        # vision tower or projector does not on a batch without images, so those runs keep DDP's search.
        values["ddp_find_unused_parameters"] = False
    return values


def hf_training_args(args: TrainArgs[Any], config_cls: type | None = None, **values: Any) -> Any:
    """`config_cls` (transformers.TrainingArguments by default, or a TRL config) from the run's training keys, the
    machine's decisions and `values` (a method's own fields, a run-time decision), later ones winning.

    A TRL config changes some of Hugging Face's defaults (learning rate, logging steps, bf16, checkpointing); the
    user's config, as Gym resolved it, wins over them, so a TRL config gets every training key, set or not."""
    from transformers import TrainingArguments

    config_cls = config_cls or TrainingArguments
    accepted = {f.name for f in dataclasses.fields(config_cls)}
    chosen = {k: v for k, v in args.training.non_defaults().items() if k not in GYM_ONLY_KEYS}
    keys: dict[str, Any] = {}
    if config_cls is not TrainingArguments:
        keys = {f.name: getattr(args.training, f.name) for f in dataclasses.fields(HFTrainingFields)
                if f.name in accepted and not f.name.startswith("gradient_checkpointing")}
    keys.update(chosen)
    keys.update(machine_values(args))
    keys.update(values)
    token = keys.pop("hub_token", None)
    if token:
        # The Trainer pickles its arguments into every checkpoint (training_args.bin): a token there would sit in
        # plain text beside the weights. The hub libraries read it from the environment instead.
        os.environ["HF_TOKEN"] = str(token)
    unknown = sorted(k for k in keys if k not in accepted)
    if unknown:
        raise ConfigError(f"'{unknown[0]}' is not a key of {config_cls.__name__} in the installed transformers/TRL: "
                          "remove it, or install the version gym/config/hf_training_fields.py was written from.")
    try:
        return config_cls(**keys)
    except ValueError as exc:  # transformers' own cross-field checks
        raise ConfigError(f"Invalid training keys: {exc}") from None
