"""Perplexity and loss on a dataset: the SFT loss on the answers of conversations, or every token of plain text.

Rows are tokenized exactly as training tokenizes them (the same chat format, cutoff_len and label mask), so
the loss here equals the training loss on the same rows: perplexity = exp(total NLL / supervised tokens),
averaged over tokens, not over rows or batches.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from gym.config.data import DataArguments
from gym.core.errors import DataError
from gym.data.loader import get_dataset
from gym.data.templates import get_chat_format
from gym.eval.model import EvalModel


def token_rows(model: EvalModel, dataset: str, dataset_dir: str, cutoff_len: int, limit: int | None
               ) -> tuple[list[dict[str, list[int]]], str]:
    """(rows with input_ids and labels, "answers" or "text"): conversations score their answers, plain text
    (pretraining rows) every token."""
    chat = model.chat_format or get_chat_format(model.tokenizer, "default")  # a base model: Human/Assistant
    args = DataArguments(dataset=dataset, dataset_dir=dataset_dir, cutoff_len=cutoff_len, max_samples=limit)
    try:
        return get_dataset(args, chat, "supervised").train, "answers"
    except DataError as supervised_error:
        try:
            return get_dataset(args, chat, "unsupervised").train, "text"
        except DataError:
            raise supervised_error from None


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


def perplexity(model: EvalModel, dataset: str, dataset_dir: str = "data", *, cutoff_len: int = 2048,
               limit: int | None = None, batch_size: int = 8, log_samples: bool = False) -> dict[str, Any]:
    rows, scored = token_rows(model, dataset, dataset_dir, cutoff_len, limit)
    nll, counts = token_nll(model.model, rows, batch_size, model.pad_id)
    tokens = sum(counts)
    if tokens == 0:
        raise DataError(f"Dataset '{dataset}' has no tokens to score within cutoff_len={cutoff_len}.")
    loss = sum(nll) / tokens
    result: dict[str, Any] = {"kind": "perplexity", "scored": scored, "items": len(rows), "tokens": tokens,
                              "metrics": {"loss": loss, "perplexity": math.exp(loss)}}
    if log_samples:
        result["samples"] = [{"row": i, "nll": n, "tokens": c} for i, (n, c) in enumerate(zip(nll, counts))]
    return result
