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


def describe_quantized(model: Any, model_args: ModelArguments, dtype: torch.dtype) -> str:
    """A base quantized on load, in words, and what its weights take against the same weights in `dtype`:
    "4-bit NF4 (bitsandbytes, double quantization), 61.2 MB of weights instead of 245.0 MB in float32". The
    quantized side counts every part stored: the packed codes and their scales (bitsandbytes keeps those in
    each weight's quant_state or SCB, torchao inside its tensor subclass); the float parts (embeddings, norms)
    count the same on both sides."""
    stored: dict[tuple[int, int], int] = {}  # by storage, so a table shared by many weights counts once
    weights = 0
    for param in model.parameters():
        for part in _stored_parts(param):
            stored[(part.data_ptr(), part.nbytes)] = part.nbytes
        state = getattr(param, "quant_state", None)
        weights += state.shape.numel() if state is not None else param.numel()  # a 4-bit code packs two
    return (f"{_format_name(model_args)}, {sum(stored.values()) / 1e6:.1f} MB of weights instead of "
            f"{weights * dtype.itemsize / 1e6:.1f} MB in {str(dtype).removeprefix('torch.')}")


def _format_name(model_args: ModelArguments) -> str:
    bits, method = model_args.quantization_bit, model_args.quantization_method
    if method == "bnb" and bits == 4:
        double = ", double quantization" if model_args.double_quantization else ""
        return f"4-bit {model_args.quantization_type.upper()} (bitsandbytes{double})"
    if method == "bnb":
        return "8-bit LLM.int8 (bitsandbytes)"
    groups = f", groups of {model_args.quantization_group_size}"
    if method == "torchao":
        return f"{bits}-bit int{bits} weight-only (torchao{groups if bits == 4 else ''})"
    return f"{bits}-bit HQQ ({groups.removeprefix(', ')})"


def _stored_parts(tensor: Any) -> list[torch.Tensor]:
    """The plain tensors a parameter is stored as: a tensor subclass's (torchao) inner tensors, and a
    bitsandbytes weight's scales (4-bit: quant_state, nested under double quantization; 8-bit: SCB)."""
    if hasattr(tensor, "__tensor_flatten__"):
        names, _ = tensor.__tensor_flatten__()
        return [part for name in names for part in _stored_parts(getattr(tensor, name))]
    parts = [tensor]
    state = getattr(tensor, "quant_state", None)
    while state is not None:
        parts += [t for t in (state.absmax, state.code, state.offset) if isinstance(t, torch.Tensor)]
        state = state.state2 if state.nested else None
    scales = getattr(tensor, "SCB", None)
    if isinstance(scales, torch.Tensor):
        parts.append(scales)
    return parts


def prepare_for_adapters(model: Any) -> Any:
    """Freeze the quantized base and keep its float parts (norms, embeddings) in float32 for stable adapter
    training (peft's recipe for k-bit training; gradient checkpointing is Gym's choice, made later)."""
    from peft import prepare_model_for_kbit_training

    return prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
