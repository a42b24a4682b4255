"""transformers' "sdpa" attention, with short half-precision rows on CPU computed as three plain ops.

PyTorch's CPU kernel behind `scaled_dot_product_attention` (flash attention) is slow backwards in bf16: on the
embedded model (9 heads of 64) a 128-token layer's attention cost ~13 ms backwards against ~3 ms forwards, a sixth
of a LoRA step. Scores, a float32 softmax and the weighted sum (what transformers' "eager" attention computes)
train the same model ~10% faster a step at 64-128 positions; from ~192 positions on they are no faster in
training and 7-15% slower forwards only, and beyond 512 slower in both (1.76x a training step at 2,048). In
float32 PyTorch's kernel is as fast or faster at every length. So the plain ops are taken only where they were
measured no slower: CPU, bf16 or fp16, a square attention of at most 128 positions. Everything else (decode steps,
GPUs, float32, longer rows, position biases) is transformers' own sdpa function, unchanged.

The choice does not depend on whether gradients are recorded: a reference model's log-probabilities (DPO, KTO,
NPO, PPO) are computed without them and must equal the policy's to the bit at the first step.

Registered in place of "sdpa" rather than under a name of our own: the model's config keeps saying "sdpa", so a
saved model loads anywhere, and models that accept no custom attention (Whisper, Qwen2-Audio) still run.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

SHORT_POSITIONS = 128
MAX_SCORES = 1 << 23  # batch x heads x positions^2 in one layer: a float32 and a bf16 copy are kept for backward
HALF = (torch.bfloat16, torch.float16)


def takes_plain_ops(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **kwargs: Any) -> bool:
    """Whether this call is one the plain ops were measured no slower for (see the module's docstring)."""
    length = query.shape[2]
    return (query.device.type == "cpu" and query.dtype in HALF and length == key.shape[2] <= SHORT_POSITIONS
            and query.shape[0] * query.shape[1] * length * length <= MAX_SCORES
            and kwargs.get("position_bias") is None and kwargs.get("softcap") is None
            and not kwargs.get("output_attentions", False))


def attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
              is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """query [B, H, T, D], key/value [B, H_kv, T, D] -> ([B, T, H, D], None), as transformers' sdpa function."""
    if not takes_plain_ops(module, query, key, value, **kwargs):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    groups = getattr(module, "num_key_value_groups", 1)
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    scores = torch.matmul(query, key.transpose(2, 3)) * scale
    lowest = torch.finfo(scores.dtype).min  # not -inf: a row with nothing to attend (padding) stays finite
    length = query.shape[2]
    if attention_mask is not None:
        mask = attention_mask[:, :, :, :length]
        scores = scores.masked_fill(~mask, lowest) if mask.dtype == torch.bool else scores + mask
    elif length > 1 and (is_causal if is_causal is not None else getattr(module, "is_causal", True)):
        future = torch.ones(length, length, dtype=torch.bool, device=query.device).triu(1)
        scores = scores.masked_fill(future, lowest)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    if dropout > 0.0:
        weights = torch.nn.functional.dropout(weights, p=dropout)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), None


def use_in_place_of_sdpa() -> None:
    """Every model that attends through transformers' "sdpa" entry uses `attention` from now on, in this process."""
    AttentionInterface.register("sdpa", attention)
