"""use_unsloth: load the model and add LoRA through Unsloth's FastLanguageModel (its patched Triton kernels for
attention, RoPE, cross-entropy and LoRA's matmuls). CUDA only, which ModelArguments.validate checks first.

Only what Unsloth's documented API offers is used: `from_pretrained` (4-bit when quantization_bit is 4) and
`get_peft_model` with the LoRA settings of the config; the result is a normal peft model for the Trainer.
"""

from __future__ import annotations

from typing import Any

import torch

from gym.config.finetuning import FinetuningArguments
from gym.config.model import ModelArguments
from gym.core.names import split_names

LINEAR_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def load(model_path: str, model_args: ModelArguments, dtype: torch.dtype) -> Any:
    from unsloth import FastLanguageModel

    model, _tokenizer = FastLanguageModel.from_pretrained(
        model_name=model_path, max_seq_length=model_args.model_max_length or 2048, dtype=dtype,
        load_in_4bit=model_args.quantization_bit == 4, load_in_8bit=model_args.quantization_bit == 8,
        trust_remote_code=model_args.trust_remote_code,
    )
    model._gym_unsloth = True
    return model


def is_unsloth(model: Any) -> bool:
    return bool(getattr(model, "_gym_unsloth", False))


def add_lora(model: Any, args: FinetuningArguments, seed: int = 0) -> Any:
    from unsloth import FastLanguageModel

    targets = split_names(args.lora_target)
    return FastLanguageModel.get_peft_model(
        model, r=args.lora_rank, lora_alpha=args.lora_alpha or 2 * args.lora_rank, lora_dropout=args.lora_dropout,
        target_modules=LINEAR_MODULES if targets == ["all"] else targets, use_rslora=args.use_rslora,
        use_gradient_checkpointing="unsloth", random_state=seed,
    )
