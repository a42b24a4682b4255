"""Which positions a causal LM projects onto its vocabulary: `logits_to_keep` as an index tensor, never an int.

transformers reads an int `logits_to_keep=n` as the slice `hidden[:, -n:]`. With more than one row and more than n
positions that slice is not contiguous, and where the head's weight is frozen (LoRA, inference) PyTorch's matmul
then cannot fold the rows into one matrix product: it broadcasts the weight to every row and copies it, transposed,
once per row. On the embedded model at four rows that was a 226 MB copy per call, 13% of a LoRA step's time. An
index tensor gathers the same positions into a contiguous block, so the head is one matrix product, and an empty
one projects nothing at all.
"""

from __future__ import annotations

import torch


def no_positions(device: torch.device | str) -> torch.Tensor:
    """For a forward whose caller wants the hidden states only (its own head, its own loss)."""
    return torch.empty(0, dtype=torch.long, device=device)


def last_positions(count: int, length: int, device: torch.device | str) -> torch.Tensor:
    """The last `count` of `length` positions: what `logits_to_keep=count` means, as indices."""
    return torch.arange(max(length - count, 0), length, device=device)
