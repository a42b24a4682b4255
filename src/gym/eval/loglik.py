"""Log-likelihood of continuations given contexts, batched: what multiple choice and lm-eval's `acc` score with.

A request is (context ids, continuation ids). Its score is the sum of log p(continuation token | everything
before it) and whether every continuation token is the model's argmax (lm-eval's `is_greedy`).

Requests that share a context (the four choices of one question) share one row: the context once, then
each continuation's tokens as a segment that sees the context and itself but not the other segments
(a 4D attention mask, positions restarting after the context for each segment). A question's choices
then cost one context's worth of compute instead of four, and one-token continuations (the letters A-D)
need no segment at all: the last context position predicts them all. Only the positions that predict a
continuation token go through the LM head. Contexts too long for the model lose tokens from the left,
as in lm-eval.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm


@dataclass(frozen=True)
class Score:
    logprob: float
    greedy: bool


def split_encode(tokenizer: Any, context: str, continuation: str, add_special_tokens: bool = False
                 ) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) as lm-eval splits them: whitespace at the end of the context moves to
    the continuation, and the pair is tokenized as one text so merges across the seam come out as the model saw
    them in training."""
    stripped = context.rstrip()
    continuation = context[len(stripped):] + continuation
    whole = tokenizer(stripped + continuation, add_special_tokens=add_special_tokens)["input_ids"]
    head = tokenizer(stripped, add_special_tokens=add_special_tokens)["input_ids"]
    if whole[:len(head)] != head:  # the seam merged across: fall back to separate encodings
        tail = tokenizer(continuation, add_special_tokens=False)["input_ids"]
        return list(head), list(tail)
    return list(head), list(whole[len(head):])


@dataclass
class _Row:
    """One forward row: a context and the continuations that share it."""

    context: list[int]
    members: list[tuple[int, list[int]]]  # (request index, continuation)

    def layout(self, max_length: int) -> tuple[list[int], list[int], list[int], list[list[int]]]:
        """(tokens, positions, segment per token, per member the row index predicting each of its tokens)."""
        segments = [c[:-1] for _, c in self.members]  # a continuation's last token is only a target
        room = max_length - sum(len(s) for s in segments)
        context = self.context[-max(1, room):]
        tokens, positions, owner = list(context), list(range(len(context))), [-1] * len(context)
        predictors: list[list[int]] = []
        for m, segment in enumerate(segments):
            start = len(tokens)
            tokens += segment
            positions += range(len(context), len(context) + len(segment))
            owner += [m] * len(segment)
            predictors.append([len(context) - 1] + list(range(start, start + len(segment))))
        return tokens, positions, owner, predictors


class LoglikScorer:
    """Scores requests on one causal LM (a transformers model, adapters merged or not)."""

    def __init__(self, model: Any, batch_size: int = 8, max_length: int | None = None, pad_id: int = 0) -> None:
        self.model = model
        self.batch_size = max(1, batch_size)
        config = getattr(model, "config", None)
        self.max_length = max_length or getattr(config, "max_position_embeddings", None) or 2048
        self.pad_id = pad_id

    def score(self, requests: list[tuple[list[int], list[int]]]) -> list[Score]:
        by_context: dict[tuple[int, ...], list[tuple[int, list[int]]]] = defaultdict(list)
        for i, (context, continuation) in enumerate(requests):
            if not continuation or not context:
                raise ValueError("every request needs a context and at least one continuation token")
            by_context[tuple(context)].append((i, continuation))
        rows = [_Row(list(context), members) for context, members in by_context.items()]
        rows.sort(key=lambda r: -(len(r.context) + sum(len(c) for _, c in r.members)))  # like lengths batch together
        scores: list[Score | None] = [None] * len(requests)
        batches = range(0, len(rows), self.batch_size)
        for start in tqdm(batches, desc="log-likelihoods", disable=None, dynamic_ncols=True, leave=False):
            self._run(rows[start:start + self.batch_size], scores)
        return [s for s in scores if s is not None]

    @torch.no_grad()
    def _run(self, batch: list[_Row], scores: list[Score | None]) -> None:
        device = next(self.model.parameters()).device
        layouts = [row.layout(self.max_length) for row in batch]
        length = max(len(tokens) for tokens, *_ in layouts)
        ids = torch.full((len(batch), length), self.pad_id, dtype=torch.long)
        positions = torch.zeros((len(batch), length), dtype=torch.long)
        owner = torch.full((len(batch), length), -2, dtype=torch.long)  # padding: a segment of its own
        for b, (tokens, pos, own, _) in enumerate(layouts):
            ids[b, :len(tokens)] = torch.tensor(tokens)
            positions[b, :len(tokens)] = torch.tensor(pos)
            owner[b, :len(tokens)] = torch.tensor(own)
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        sees = (owner[:, None, :] == -1) | (owner[:, :, None] == owner[:, None, :])  # the context, or its own segment
        dtype = next(self.model.parameters()).dtype
        mask = torch.zeros(len(batch), 1, length, length, dtype=dtype)
        mask.masked_fill_(~(sees & causal)[:, None], torch.finfo(dtype).min)
        wanted = sorted({p for *_, predictors in layouts for member in predictors for p in member})
        keep = torch.tensor(wanted, dtype=torch.long)
        logits = self.model(input_ids=ids.to(device), attention_mask=mask.to(device),
                            position_ids=positions.to(device), use_cache=False, logits_to_keep=keep.to(device)).logits
        column = {p: k for k, p in enumerate(wanted)}
        for b, (row, (*_, predictors)) in enumerate(zip(batch, layouts)):
            for (index, continuation), where in zip(row.members, predictors):
                span = logits[b, [column[p] for p in where]].float().log_softmax(-1)
                target = torch.tensor(continuation, device=span.device)
                logprob = span.gather(-1, target[:, None]).sum().item()
                scores[index] = Score(logprob, bool((span.argmax(-1) == target).all()))
