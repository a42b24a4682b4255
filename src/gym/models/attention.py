"""Shifted sparse attention (S²-Attn, LongLoRA: Chen et al., 2024) as a transformers attention function.

Training only: the sequence is cut into groups of a quarter of its length and each token attends causally within
its group; half of the heads see groups shifted by half a group, so information still flows between neighbouring
groups. Attention costs T x T/4 instead of T x T, which is what lets LoRA train on long contexts. At evaluation and
generation the model attends in full, as the paper prescribes (the trained model is a normal model).

Where we depart from the paper's code: its shifted groups wrap around, so the last group holds the sequence's end
followed by its start, and the start's tokens could attend to the end (their future). Here every allowed pair is
also causal in true positions, so no token ever sees its future. Padding, on the right, is never attended for the
same reason. It works with any model whose attention goes through transformers' AttentionInterface.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

SHIFT_ATTENTION = "gym_shifted_sparse"
GROUP_RATIO = 0.25  # LongLoRA's group size: a quarter of the training length


def group_masks(length: int, size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """[groups, size, size] boolean masks for the plain and the shifted heads (True = may attend)."""
    positions = torch.arange(length, device=device)
    plain = positions.reshape(-1, size)
    shifted = positions.roll(-(size // 2)).reshape(-1, size)
    return plain[:, None, :] <= plain[:, :, None], shifted[:, None, :] <= shifted[:, :, None]


def shifted_sparse_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, dropout: float = 0.0,
                             scaling: float | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """query [B, H, T, D], key/value [B, H_kv, T, D] -> ([B, T, H, D], None), as transformers' functions."""
    if not module.training or query.shape[2] != key.shape[2] or query.shape[2] < 8:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    key = repeat_kv(key, module.num_key_value_groups)
    value = repeat_kv(value, module.num_key_value_groups)
    batch, heads, length, dim = query.shape
    size = math.ceil(length * GROUP_RATIO)
    padded = math.ceil(length / size) * size
    half, shift = heads // 2, size // 2

    def grouped(x: torch.Tensor) -> torch.Tensor:
        x = F.pad(x, (0, 0, 0, padded - length))  # zeros after the end: later than every real token
        x = torch.cat([x[:, :half], x[:, half:].roll(-shift, dims=2)], dim=1)
        return x.reshape(batch, heads, padded // size, size, dim)

    plain, shifted = group_masks(padded, size, query.device)
    mask = torch.cat([plain.expand(half, -1, -1, -1), shifted.expand(heads - half, -1, -1, -1)])
    out = F.scaled_dot_product_attention(grouped(query), grouped(key), grouped(value), attn_mask=mask,
                                         dropout_p=dropout, scale=scaling)
    out = out.reshape(batch, heads, padded, dim)
    out = torch.cat([out[:, :half], out[:, half:].roll(shift, dims=2)], dim=1)[:, :, :length]
    return out.transpose(1, 2).contiguous(), None


def register_shift_attention() -> str:
    """Make `attn_implementation=SHIFT_ATTENTION` known to transformers (its masks are sdpa's)."""
    AttentionInterface.register(SHIFT_ATTENTION, shifted_sparse_attention)
    AttentionMaskInterface.register(SHIFT_ATTENTION, sdpa_mask)
    return SHIFT_ATTENTION
