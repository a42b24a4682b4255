"""LoftQ initialisation (Li et al., 2023) for QLoRA: start each LoRA adapter at the best rank-r approximation (to
a fraction of a percent, below) of what 4-bit rounding took from its weight, so the quantized base plus the
adapter starts near the original model instead of at the rounded one.

One alternating step of the paper (quantize, then fit the residual by SVD), which its authors found captures
most of the gain; we quantize with bitsandbytes' own NF4/FP4, so the residual is exactly the one training sees.
peft ships this as `replace_lora_weights_loftq`, but computes on CUDA only and ignores the LoRA scaling; this
runs wherever the model is and divides the scaling out, so that scaling * B @ A equals the residual's top-r part.

The top-r part comes from a randomized SVD with power iterations (Halko et al., 2011; what PiSSA's `pissa_iter`
does), not a full SVD: only r of the singular vectors are used, and the full decomposition was nearly all of the
start-up (12.8 of 13.2 s for the embedded model's 210 matrices on one core; now 4.2 s in all). On the embedded
model's rounding residuals it keeps 99.9-100% of the energy the exact top-r part removes; 98.8% on pure noise,
the worst case for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from gym.core.errors import ModelError
from gym.core.safetensors_files import open_safetensors

PEFT_PREFIX = "base_model.model."
# Power iterations and extra columns of the randomized SVD: 16 as PiSSA's default; 8 columns more than the rank
# is the usual oversampling. A matrix narrower than 8x the sketch is small enough for the exact, full SVD.
POWER_ITERATIONS = 16
OVERSAMPLE = 8


def original_weights(model_dir: str) -> dict[str, str]:
    """Tensor name -> the safetensors file (of the unquantized model) that holds it."""
    folder = Path(model_dir)
    if not folder.is_dir():
        from huggingface_hub import snapshot_download

        folder = Path(snapshot_download(model_dir, local_files_only=True))
    where: dict[str, str] = {}
    for file in sorted(folder.glob("*.safetensors")):
        with open_safetensors(file) as handle:
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
        with open_safetensors(files[key]) as handle:
            original = handle.get_tensor(key).float()
        quantized: Any = module.get_base_layer().weight
        rounded = bnb.functional.dequantize_4bit(quantized.data, quantized.quant_state).float().cpu()
        rank, scaling = module.r[adapter], module.scaling[adapter]
        u, s, vh = top_singular(original.cpu() - rounded, rank)
        root = (s / scaling).sqrt()
        lora_a: Any = module.lora_A[adapter].weight
        lora_b: Any = module.lora_B[adapter].weight
        lora_a.copy_((root[:, None] * vh).to(lora_a))
        lora_b.copy_((u * root).to(lora_b))
        done += 1
    return done


def top_singular(matrix: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(U, S, Vh) of `matrix`'s largest `rank` singular values: U is m x rank, Vh rank x n."""
    width = rank + OVERSAMPLE
    if min(matrix.shape) < 8 * width:
        u, s, vh = torch.linalg.svd(matrix, full_matrices=False)
        return u[:, :rank], s[:rank], vh[:rank]
    # The sketch is random: a fixed seed on a forked generator gives the same adapter on every run and leaves the
    # caller's random stream (data order, dropout) as it was.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        u, s, v = torch.svd_lowrank(matrix, q=width, niter=POWER_ITERATIONS)
    return u[:, :rank], s[:rank], v[:, :rank].T
