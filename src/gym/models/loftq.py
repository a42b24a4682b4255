"""LoftQ initialisation (Li et al., 2023) for QLoRA: start each LoRA adapter at the best rank-r approximation of
what 4-bit rounding took from its weight, so the quantized base plus the adapter starts near the original model
instead of at the rounded one.

One alternating step of the paper (quantize, then fit the residual by SVD), which its authors found captures
most of the gain; we quantize with bitsandbytes' own NF4/FP4, so the residual is exactly the one training sees.
peft ships this as `replace_lora_weights_loftq`, but computes on CUDA only and ignores the LoRA scaling; this
runs wherever the model is and divides the scaling out, so that scaling * B @ A equals the residual's top-r part.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from gym.core.errors import ModelError

PEFT_PREFIX = "base_model.model."


def original_weights(model_dir: str) -> dict[str, str]:
    """Tensor name -> the safetensors file (of the unquantized model) that holds it."""
    folder = Path(model_dir)
    if not folder.is_dir():
        from huggingface_hub import snapshot_download

        folder = Path(snapshot_download(model_dir, local_files_only=True))
    where: dict[str, str] = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            where.update(dict.fromkeys(handle.keys(), str(file)))
    return where


@torch.no_grad()
def loftq_initialise(peft_model: Any, model_dir: str, adapter: str = "default") -> int:
    """Set every 4-bit LoRA layer's A and B from its weight's rounding error; returns how many it set."""
    import bitsandbytes as bnb
    from peft.tuners.lora.bnb import Linear4bit

    files = original_weights(model_dir)
    done = 0
    for name, module in peft_model.named_modules():
        if not isinstance(module, Linear4bit) or adapter not in module.lora_A:
            continue
        key = name.removeprefix(PEFT_PREFIX) + ".weight"
        if key not in files:
            raise ModelError(f"loftq_init reads the unquantized weights from {model_dir}, which has no tensor {key}.")
        with safe_open(files[key], framework="pt") as handle:
            original = handle.get_tensor(key).float()
        quantized: Any = module.get_base_layer().weight
        rounded = bnb.functional.dequantize_4bit(quantized.data, quantized.quant_state).float().cpu()
        u, s, vh = torch.linalg.svd(original.cpu() - rounded, full_matrices=False)
        rank, scaling = module.r[adapter], module.scaling[adapter]
        root = (s[:rank] / scaling).sqrt()
        lora_a: Any = module.lora_A[adapter].weight
        lora_b: Any = module.lora_B[adapter].weight
        lora_a.copy_((root[:, None] * vh[:rank]).to(lora_a))
        lora_b.copy_((u[:, :rank] * root).to(lora_b))
        done += 1
    return done
