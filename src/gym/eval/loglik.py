"""Log-likelihood of continuations given contexts, batched: what multiple choice and lm-eval's `acc` score with.

A request is (context ids, continuation ids). Its score is the sum of log p(continuation token | everything
before it) and whether every continuation token is the model's argmax (lm-eval's `is_greedy`). Contexts
that are too long lose tokens from the left, as in lm-eval. Requests whose continuations are all one token
and share a context (the letters A-D after one question) cost one forward pass together, not one each.
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


class LoglikScorer:
    """Scores requests on one causal LM (a transformers model, adapters merged or not)."""

    def __init__(self, model: Any, batch_size: int = 8, max_length: int | None = None, pad_id: int = 0) -> None:
        self.model = model
        self.batch_size = max(1, batch_size)
        config = getattr(model, "config", None)
        self.max_length = max_length or getattr(config, "max_position_embeddings", None) or 2048
        self.pad_id = pad_id

    def score(self, requests: list[tuple[list[int], list[int]]]) -> list[Score]:
        if any(not continuation for _, continuation in requests):
            raise ValueError("every request needs at least one continuation token")
        # One unit per forward row: (sequence, [(request index, first target position, continuation)]).
        units: list[tuple[list[int], list[tuple[int, int, list[int]]]]] = []
        single: dict[tuple[int, ...], list[int]] = defaultdict(list)
        for i, (context, continuation) in enumerate(requests):
            if len(continuation) == 1 and context:
                single[tuple(context)].append(i)
            else:
                units.append(self._unit(context, continuation, [i]))
        for shared, members in single.items():
            sequence, targets = self._unit(list(shared), requests[members[0]][1], members)
            units.append((sequence, [(i, targets[0][1], requests[i][1]) for i in members]))
        scores: list[Score | None] = [None] * len(requests)
        order = sorted(range(len(units)), key=lambda u: -len(units[u][0]))  # similar lengths share a batch
        batches = range(0, len(order), self.batch_size)
        for start in tqdm(batches, desc="log-likelihoods", disable=None, dynamic_ncols=True, leave=False):
            self._run([units[u] for u in order[start:start + self.batch_size]], scores)
        assert all(s is not None for s in scores)
        return [s for s in scores if s is not None]

    def _unit(self, context: list[int], continuation: list[int], members: list[int]
              ) -> tuple[list[int], list[tuple[int, int, list[int]]]]:
        whole = (context + continuation)[-(self.max_length + 1):]
        if len(whole) < 2:  # nothing to condition on: lm-eval conditions on EOS; we need at least one token
            raise ValueError("a request needs a context of at least one token")
        sequence = whole[:-1]  # the last continuation token is only a target
        first = len(sequence) - len(continuation)  # position whose logits predict the first continuation token
        return sequence, [(i, first, continuation) for i in members]

    @torch.no_grad()
    def _run(self, batch: list[tuple[list[int], list[tuple[int, int, list[int]]]]], scores: list[Score | None]
             ) -> None:
        device = next(self.model.parameters()).device
        longest = max(len(sequence) for sequence, _ in batch)
        ids = torch.full((len(batch), longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), longest), dtype=torch.long)
        for row, (sequence, _) in enumerate(batch):
            ids[row, :len(sequence)] = torch.tensor(sequence)
            mask[row, :len(sequence)] = 1
        logits = self.model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False).logits
        for row, (_, targets) in enumerate(batch):
            for index, first, continuation in targets:
                span = logits[row, first:first + len(continuation)].float().log_softmax(-1)
                wanted = torch.tensor(continuation, device=span.device)
                logprob = span.gather(-1, wanted[:, None]).sum().item()
                greedy = bool((span.argmax(-1) == wanted).all())
                scores[index] = Score(logprob, greedy)
