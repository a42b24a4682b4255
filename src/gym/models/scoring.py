"""What a loaded model says of given text: the log-likelihood of each row's labelled tokens. Evaluation (perplexity)
and delta compression (how much of a fine-tune's gain a delta keeps) score models the same way."""

from __future__ import annotations

from typing import Any

import torch


@torch.no_grad()
def token_nll(model: Any, rows: list[dict[str, list[int]]], batch_size: int = 8, pad_id: int = 0
              ) -> tuple[list[float], list[int]]:
    """Per row: the summed negative log-likelihood of its labelled tokens, and how many there are."""
    device = next(model.parameters()).device
    nll: list[float] = []
    counts: list[int] = []
    model.eval()
    for start in range(0, len(rows), batch_size):
        batch = rows[start:start + batch_size]
        longest = max(len(r["input_ids"]) for r in batch)
        ids = torch.tensor([r["input_ids"] + [pad_id] * (longest - len(r["input_ids"])) for r in batch])
        labels = torch.tensor([r["labels"] + [-100] * (longest - len(r["labels"])) for r in batch])
        mask = torch.tensor([[1] * len(r["input_ids"]) + [0] * (longest - len(r["input_ids"])) for r in batch])
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False).logits.float()
        targets = labels[:, 1:].to(device)
        losses = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), targets, ignore_index=-100,
                                                   reduction="none")
        nll += losses.sum(dim=1).tolist()
        counts += (targets != -100).sum(dim=1).tolist()
    return nll, counts
