"""Choosing each row's next token from its logits, for a whole batch at once.

Every request has its own settings (temperature, top_k, top_p, repetition_penalty) and its own seeded
generator, and its token must not depend on which other requests share the batch. The work that is
the same for every row (softmax, sorting for top-p, the cumulative sums) runs once on the batch; only
the random draw is per row: one uniform number from the row's generator, turned into a token by
inverse-CDF over the row's kept probabilities. A seeded request therefore samples the same answer alone
or in any batch.
"""

from __future__ import annotations

import torch

from gym.infer.requests import Request


def apply_repetition_penalty(scores: torch.Tensor, seen: list[int], penalty: float) -> None:
    """CTRL's penalty, in place on one row: seen tokens' logits are divided (if positive) or multiplied by it."""
    index = torch.tensor(sorted(set(seen)), dtype=torch.long)
    picked = scores[index]
    scores[index] = torch.where(picked > 0, picked / penalty, picked * penalty)


def sample_rows(requests: list[Request], logits: torch.Tensor) -> list[int]:
    """The next token of each request; `logits` is [rows, vocab] float32 (modified in place)."""
    for row, request in enumerate(requests):
        if request.params.repetition_penalty != 1.0:
            apply_repetition_penalty(logits[row], request.prompt_ids + request.generated,
                                     request.params.repetition_penalty)
    tokens = logits.argmax(-1).tolist()
    sampled = [row for row, request in enumerate(requests) if not request.params.greedy]
    if not sampled:
        return tokens
    rows = torch.tensor(sampled)
    params = [requests[row].params for row in sampled]
    scores = logits[rows] / torch.tensor([p.temperature for p in params])[:, None]
    # Candidates in descending order: the top-k when every row limits k (cheap), else the whole vocabulary.
    ks = [p.top_k if p.top_k and p.top_k > 0 else scores.shape[-1] for p in params]
    width = min(max(ks), scores.shape[-1])
    values, order = scores.topk(width, dim=-1, sorted=True)
    position = torch.arange(width)[None, :]
    values = values.masked_fill(position >= torch.tensor(ks)[:, None], float("-inf"))
    probs = torch.softmax(values, dim=-1)
    top_p = torch.tensor([p.top_p for p in params])[:, None]
    cumulative = probs.cumsum(-1)
    # Nucleus: the smallest prefix whose probability reaches top_p (the first candidate always stays).
    probs = probs.masked_fill((cumulative - probs) >= top_p, 0.0)
    cdf = probs.cumsum(-1)
    draws = torch.cat([torch.rand(1, generator=requests[row].generator) for row in sampled])
    picked = (cdf < (draws * cdf[:, -1])[:, None]).sum(-1).clamp(max=width - 1)
    for i, row in enumerate(sampled):
        tokens[row] = int(order[i, picked[i]])
    return tokens
