"""Batches for causal LM training: dynamic padding, and isolation masks for packed rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from gym.data.processors import IGNORE_INDEX


def block_causal_mask(seq_lens: list[list[int]], length: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[batch, 1, length, length] additive mask: each example attends causally to itself only.

    Padding after the last example forms its own block, so no query row is fully masked (a fully
    masked softmax row is NaN, and NaN leaks into gradients).
    """
    batch = len(seq_lens)
    segment = torch.empty(batch, length, dtype=torch.long)
    for b, lens in enumerate(seq_lens):
        ids = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens, dtype=torch.long))
        segment[b, : len(ids)] = ids
        segment[b, len(ids) :] = len(lens)
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    allowed = (segment[:, :, None] == segment[:, None, :]) & causal
    mask = torch.zeros(batch, 1, length, length, dtype=dtype)
    return mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)


@dataclass
class CausalLMCollator:
    """Pads to the longest row in the batch. Packed rows (with `seq_lens`) get a block-diagonal mask,
    or, with flash-attention, restarting position_ids (which flash-attention turns into varlen calls)."""

    pad_token_id: int
    flash_attention: bool = False
    mask_dtype: torch.dtype = torch.float32

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        length = max(len(f["input_ids"]) for f in features)
        batch = len(features)
        input_ids = torch.full((batch, length), self.pad_token_id, dtype=torch.long)
        labels = torch.full((batch, length), IGNORE_INDEX, dtype=torch.long)
        attention = torch.zeros((batch, length), dtype=torch.long)
        for b, f in enumerate(features):
            n = len(f["input_ids"])
            input_ids[b, :n] = torch.tensor(f["input_ids"])
            labels[b, :n] = torch.tensor(f["labels"])
            attention[b, :n] = 1
        out = {"input_ids": input_ids, "labels": labels, "num_tokens": attention.sum()}
        if "seq_lens" not in features[0]:
            out["attention_mask"] = attention
            return out
        positions = torch.zeros((batch, length), dtype=torch.long)
        for b, f in enumerate(features):
            positions[b, : len(f["position_ids"])] = torch.tensor(f["position_ids"])
        out["position_ids"] = positions
        if not self.flash_attention:
            out["attention_mask"] = block_causal_mask([f["seq_lens"] for f in features], length, self.mask_dtype)
        return out
