"""Perplexity and loss on a dataset: the SFT loss on the answers of conversations, or every token of plain text.

Rows are tokenized exactly as training tokenizes them (the same chat format, cutoff_len and label mask), so
the loss here equals the training loss on the same rows: perplexity = exp(total NLL / supervised tokens),
averaged over tokens, not over rows or batches.
"""

from __future__ import annotations

import math
from typing import Any

from gym.config.data import DataArguments
from gym.core.errors import DataError
from gym.data.loader import get_dataset
from gym.data.templates import get_chat_format
from gym.eval.model import EvalModel
from gym.models.scoring import token_nll


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
