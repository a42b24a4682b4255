"""Batches for causal LM training: dynamic padding, and isolation masks for packed rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from gym.data.media import KINDS as MEDIA_KINDS
from gym.data.processors import IGNORE_INDEX

if TYPE_CHECKING:
    from gym.data.multimodal import MediaInputs


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


@dataclass
class MediaCollator(CausalLMCollator):
    """CausalLMCollator plus the batch's media tensors, decoded and processed when the batch is made."""

    media: MediaInputs | None = None

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = super().__call__([{k: v for k, v in f.items() if k not in MEDIA_KINDS} for f in features])
        assert self.media is not None
        decoded: dict[str, list[Any]] = {kind: [] for kind in MEDIA_KINDS}
        for f in features:
            for kind in MEDIA_KINDS:
                decoded[kind] += self.media.decode(kind, f.get(kind) or [], "batch")
        if any(decoded.values()):
            batch.update(self.media.features({k: v for k, v in decoded.items() if v}, batch["input_ids"]))
        return batch
