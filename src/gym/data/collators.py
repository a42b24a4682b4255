"""Batches for causal LM training: dynamic padding, and isolation masks for packed rows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from gym.data.media import KINDS as MEDIA_KINDS
from gym.data.multimodal import PER_TOKEN_KEYS
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


@dataclass
class MediaBatchCollator:
    """Another collator's batch of token ids (TRL's preference collators: `ids`) plus the rows' media tensors.

    `repeats`: how many times the batch lays the rows out, in order (2 for DPO: every row's chosen sequence, then
    every row's rejected one, each behind the same prompt and so the same media); the media are repeated to match,
    since the model takes one image's features per run of its tokens. `column`: the row key that holds a kind's
    items. A per-token type the processor adds (Gemma 3's token_type_ids) is mapped onto every id tensor of the batch
    (`input_ids`, and KTO's `KL_input_ids` as `KL_token_type_ids`)."""

    ids: Callable[[list[dict[str, Any]]], dict[str, Any]]
    media: MediaInputs
    repeats: int = 1
    column: str = "{kind}"

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        columns = {kind: self.column.format(kind=kind) for kind in MEDIA_KINDS}
        batch = self.ids([{k: v for k, v in f.items() if k not in columns.values()} for f in features])
        decoded = {kind: [item for f in features for item in self.media.decode(kind, f.get(column) or [], "batch")]
                   for kind, column in columns.items()}
        decoded = {kind: items * self.repeats for kind, items in decoded.items() if items}
        if not decoded:
            return batch
        tensors = self.media.features(decoded, batch["input_ids"])
        for key in PER_TOKEN_KEYS:
            if key not in tensors:
                continue
            marked = tensors[key] != 0
            kinds = dict(zip(batch["input_ids"][marked].tolist(), tensors[key][marked].tolist(), strict=True))
            for ids_key in [k for k in batch if k.endswith("input_ids") and k != "input_ids"]:
                types = torch.zeros_like(batch[ids_key])
                for token_id, kind in kinds.items():
                    types[batch[ids_key] == token_id] = kind
                tensors[ids_key.removesuffix("input_ids") + key] = types
        batch.update(tensors)
        return batch
