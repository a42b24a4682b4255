"""The quantization settings of a config -> transformers' quantization config, and what a quantized base needs
before adapters train on it.

Which combinations can run was checked by BaseQuantizationArguments.validate; here they are only built.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from gym.config.model import ModelArguments


def quantization_config(model_args: ModelArguments | None, compute_dtype: torch.dtype) -> Any | None:
    """BitsAndBytesConfig / TorchAoConfig / HqqConfig for `from_pretrained`, or None when not quantizing."""
    if model_args is None or model_args.quantization_bit is None:
        return None
    bits, method = model_args.quantization_bit, model_args.quantization_method
    if method == "bnb":
        from transformers import BitsAndBytesConfig

        return BitsAndBytesConfig(
            load_in_4bit=bits == 4, load_in_8bit=bits == 8,
            bnb_4bit_quant_type=model_args.quantization_type,
            bnb_4bit_use_double_quant=model_args.double_quantization,
            # The adapters and activations stay in the dtype the rest of the model trains in.
            bnb_4bit_compute_dtype=compute_dtype,
            bnb_4bit_quant_storage=torch.uint8,
        )
    if method == "torchao":
        from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig
        from transformers import TorchAoConfig

        scheme = (Int4WeightOnlyConfig(group_size=model_args.quantization_group_size) if bits == 4
                  else Int8WeightOnlyConfig())
        return TorchAoConfig(scheme)
    from transformers import HqqConfig

    return HqqConfig(nbits=bits, group_size=model_args.quantization_group_size)


def device_map() -> dict[str, Any]:
    """Quantizers place the weights as they load them: this process's GPU (its LOCAL_RANK), else the CPU."""
    if torch.cuda.is_available():
        return {"": torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))}
    return {"": torch.device("cpu")}


def is_quantized(model: Any) -> bool:
    """Whether transformers loaded this model (or the model under a peft wrapper) quantized."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(base, "hf_quantizer", None) is not None or bool(getattr(base, "is_quantized", False))


def prepare_for_adapters(model: Any) -> Any:
    """Freeze the quantized base and keep its float parts (norms, embeddings) in float32 for stable adapter
    training (peft's recipe for k-bit training; gradient checkpointing is Gym's choice, made later)."""
    from peft import prepare_model_for_kbit_training

    return prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
