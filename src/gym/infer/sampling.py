"""Choosing each row's next token from its logits, for a whole batch at once.

Every request has its own settings (temperature, top_k, top_p, repetition_penalty) and its own seeded
generator, and its token must not depend on which other requests share the batch. The work that is
the same for every row (softmax, sorting for top-p, the cumulative sums) runs once on the batch; only
the random draw is per row: one uniform number from the row's generator, turned into a token by
inverse-CDF over the row's kept probabilities. A seeded request therefore samples the same answer alone
or in any batch. The cumulative sums are in float64: torch sums a lone row and a row of a batch in
different orders, and over a near-uniform 49k-token distribution float32's rounding moves the CDF by
more than a token's width, so a draw would land on different tokens alone and in a batch.
"""

from __future__ import annotations

import torch

from gym.infer.requests import Request


def apply_repetition_penalty(scores: torch.Tensor, seen: list[int], penalty: float) -> None:
    """CTRL's penalty, in place on one row: seen tokens' logits are divided (if positive) or multiplied by it."""
    index = torch.tensor(sorted(set(seen)), dtype=torch.long, device=scores.device)
    picked = scores[index]
    scores[index] = torch.where(picked > 0, picked / penalty, picked * penalty)


def sample_rows(requests: list[Request], logits: torch.Tensor) -> list[int]:
    """The next token of each request; `logits` is [rows, vocab] float32 on any device (modified in place)."""
    for row, request in enumerate(requests):
        if request.params.repetition_penalty != 1.0:
            apply_repetition_penalty(logits[row], request.prompt_ids + request.generated,
                                     request.params.repetition_penalty)
    tokens = logits.argmax(-1).tolist()
    sampled = [row for row, request in enumerate(requests) if not request.params.greedy]
    if not sampled:
        return tokens
    params = [requests[row].params for row in sampled]
    # The sampled rows come to the CPU (a GPU engine's logits are on the GPU): the requests' seeded
    # generators are CPU generators, and a draw must not depend on the device that computed the logits.
    chosen = logits[torch.tensor(sampled, device=logits.device)].cpu()
    probs = torch.softmax(chosen / torch.tensor([p.temperature for p in params])[:, None], -1)
    draws = torch.cat([torch.rand(1, generator=requests[row].generator) for row in sampled])
    ks = torch.tensor([p.top_k if p.top_k and p.top_k > 0 else 0 for p in params])
    top_p = torch.tensor([min(p.top_p, 1.0) for p in params])
    unfiltered = (ks == 0) & (top_p >= 1.0)
    picks = torch.empty(len(sampled), dtype=torch.long)
    if unfiltered.any():  # plain temperature sampling needs no candidate order: inverse CDF over the vocabulary
        cdf = probs[unfiltered].double().cumsum(-1)
        target = (draws[unfiltered] * cdf[:, -1])[:, None]
        picks[unfiltered] = torch.searchsorted(cdf, target).squeeze(-1).clamp(max=probs.shape[-1] - 1)
    filtered = ~unfiltered
    if filtered.any():
        picks[filtered] = _sample_filtered(probs[filtered], ks[filtered], top_p[filtered], draws[filtered])
    for i, row in enumerate(sampled):
        tokens[row] = int(picks[i])
    return tokens


def _sample_filtered(probs: torch.Tensor, ks: torch.Tensor, top_p: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """Top-k then top-p (on the top-k renormalized), by inverse CDF over the kept candidates in descending
    order. A nucleus is usually a few dozen tokens, so candidates are found with a narrow topk that widens
    only for rows whose nucleus it does not yet hold; sorting 49k-token vocabularies every step cost ~40%
    of a 16-stream step."""
    vocab = probs.shape[-1]
    has_k = ks > 0
    width = min(vocab, max(64, int(ks.max())))
    while True:
        values, order = probs.topk(width, dim=-1, sorted=True)
        values = values.double()
        position = torch.arange(width)[None, :]
        values = values.masked_fill(has_k[:, None] & (position >= ks[:, None]), 0.0)
        # Rows without top_k keep their full-vocabulary probabilities (they sum to 1 over the vocabulary).
        values = values / torch.where(has_k, values.sum(-1), torch.ones((), dtype=values.dtype))[:, None]
        cumulative = values.cumsum(-1)
        if width == vocab or bool((has_k | (cumulative[:, -1] >= top_p)).all()):
            break
        width = min(vocab, width * 8)
    # Nucleus: the smallest prefix whose probability reaches top_p (the first candidate always stays).
    values = values.masked_fill((cumulative - values) >= top_p[:, None], 0.0)
    cdf = values.cumsum(-1)
    picked = (cdf < (draws * cdf[:, -1])[:, None]).sum(-1).clamp(max=width - 1)
    return order.gather(1, picked[:, None]).squeeze(1)
