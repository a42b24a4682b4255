"""Choosing each row's next token from its logits, for a whole batch at once.

Every request has its own settings (temperature, top_k, top_p, repetition_penalty) and its own seeded
generator, and its token must not depend on which other requests share the batch. The softmax runs once
on the batch; a top-p row's nucleus is then found among its likely tokens in numpy (for a 49k vocabulary
torch's small ops cost more in thread hand-offs than in work: bench/sampling_speed.py), or by a batched
topk where those do not hold it. Where the fast engine's kernels are loaded, the softmax and the nucleus
picks run in them instead (csrc/sampling.cpp: the same picks, ~2x faster at 16 rows); their probabilities
differ from torch's softmax in the last bits only, so a pick can change only for a draw within ~1e-7 of a
token's edge. The random draw is per row: one uniform number from the row's
generator, turned into a token by inverse-CDF over the row's kept probabilities. A seeded request
therefore samples the same answer alone or in any batch. The cumulative sums are in float64: torch sums
a lone row and a row of a batch in different orders, and over a near-uniform 49k-token distribution
float32's rounding moves the CDF by more than a token's width, so a draw would land on different tokens
alone and in a batch.
"""

from __future__ import annotations

import numpy as np
import torch

from gym.infer.fast import kernels
from gym.infer.requests import Request


def apply_repetition_penalty(scores: torch.Tensor, seen: list[int], penalty: float) -> None:
    """CTRL's penalty, in place on one row: seen tokens' logits are divided (if positive) or multiplied by it."""
    index = torch.tensor(sorted(set(seen)), dtype=torch.long, device=scores.device)
    picked = scores[index]
    scores[index] = torch.where(picked > 0, picked / penalty, picked * penalty)


# The nucleus of a top-p row is looked for first among the tokens at least this fraction as likely as the
# likeliest one (a few dozen for a trained model's peaked distribution); when they do not hold top_p of
# the mass, or are more than MAX_CANDIDATES, the row goes the batched topk way.
NUCLEUS_CUT = 1e-4
MAX_CANDIDATES = 4096


def sample_rows(requests: list[Request], logits: torch.Tensor) -> list[int]:
    """The next token of each request; `logits` is [rows, vocab] float32 on any device (modified in place).
    A constrained request's row first loses every token its grammar does not allow (gym.infer.grammar);
    the other rows are untouched, so their tokens do not depend on who shares the batch."""
    constrained = False
    for row, request in enumerate(requests):
        if request.params.repetition_penalty != 1.0:
            apply_repetition_penalty(logits[row], request.prompt_ids + request.generated,
                                     request.params.repetition_penalty)
        if request.matcher is not None:
            request.matcher.mask(logits[row])
            constrained = True
    tokens = _pick(requests, logits)
    if constrained:
        for row, request in enumerate(requests):
            # Inverse-CDF sampling lands on a zero-probability token only for a draw of exactly 0 (the first
            # index, whatever it is); a constrained row takes its likeliest allowed token instead.
            if request.matcher is not None and not request.matcher.allows(tokens[row]):
                tokens[row] = int(logits[row].argmax())
    return tokens


def _pick(requests: list[Request], logits: torch.Tensor) -> list[int]:
    tokens = [0] * len(requests)
    greedy = [row for row, request in enumerate(requests) if request.params.greedy]
    if greedy:
        rows = logits if len(greedy) == len(requests) else logits[torch.tensor(greedy, device=logits.device)]
        for row, token in zip(greedy, _argmax(rows)):
            tokens[row] = token
    sampled = [row for row, request in enumerate(requests) if not request.params.greedy]
    if not sampled:
        return tokens
    params = [requests[row].params for row in sampled]
    # The sampled rows come to the CPU (a GPU engine's logits are on the GPU): the requests' seeded
    # generators are CPU generators, and a draw must not depend on the device that computed the logits.
    chosen = logits if len(sampled) == len(requests) else logits[torch.tensor(sampled, device=logits.device)]
    probs = kernels.softmax_rows(chosen.cpu(), [p.temperature for p in params])
    draws = [float(torch.rand(1, generator=requests[row].generator)) for row in sampled]
    ks = [p.top_k if p.top_k and p.top_k > 0 else 0 for p in params]
    top_p = [min(p.top_p, 1.0) for p in params]
    picks = [-1] * len(sampled)  # -1: not picked yet
    nucleus = [i for i in range(len(sampled)) if not ks[i] and top_p[i] < 1.0]
    if nucleus:
        for i, pick in zip(nucleus, _nucleus_picks(probs, nucleus, [top_p[i] for i in nucleus],
                                                   [draws[i] for i in nucleus])):
            picks[i] = pick
    # Plain temperature sampling needs no candidate order: inverse CDF over the vocabulary.
    unfiltered = [i for i in range(len(sampled)) if not ks[i] and top_p[i] >= 1.0]
    if unfiltered:
        cdf = probs[unfiltered].double().cumsum(-1)
        target = (torch.tensor([draws[i] for i in unfiltered], dtype=torch.float64) * cdf[:, -1])[:, None]
        chosen_tokens = torch.searchsorted(cdf, target).squeeze(-1).clamp(max=probs.shape[-1] - 1).tolist()
        for i, token in zip(unfiltered, chosen_tokens):
            picks[i] = token
    rest = [i for i in range(len(sampled)) if picks[i] < 0]
    if rest:
        tokens_rest = _sample_filtered(probs[rest], torch.tensor([ks[i] for i in rest]),
                                       torch.tensor([top_p[i] for i in rest]),
                                       torch.tensor([draws[i] for i in rest], dtype=torch.float64)).tolist()
        for i, token in zip(rest, tokens_rest):
            picks[i] = token
    for i, row in enumerate(sampled):
        tokens[row] = picks[i]
    return tokens


def _argmax(logits: torch.Tensor) -> list[int]:
    # On the CPU, numpy's single-threaded argmax: torch's parallel one over a 49k vocabulary costs ~40 µs of
    # thread hand-offs for ~3 µs of work, every token.
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64):
        return logits.detach().numpy().argmax(-1).tolist()
    return logits.argmax(-1).tolist()


def _nucleus_picks(probs: torch.Tensor, rows: list[int], top_p: list[float], draws: list[float]) -> list[int]:
    """_nucleus_pick of each of `rows` (-1 where it gives None): in the fast engine's compiled kernels where they
    are loaded (the same picks, every row in one call, ~2x faster at 16 rows: bench/sampling_speed.py), else here."""
    chosen = probs if len(rows) == probs.shape[0] else probs[rows]
    compiled = kernels.nucleus_pick(chosen, top_p, draws, NUCLEUS_CUT, MAX_CANDIDATES)
    if compiled is not None:
        return compiled
    row_probs = chosen.numpy()
    picks = [_nucleus_pick(row_probs[i], top_p[i], draws[i]) for i in range(len(rows))]
    return [-1 if pick is None else pick for pick in picks]


def _nucleus_pick(probs: np.ndarray, top_p: float, draw: float) -> int | None:
    """Top-p sampling of one row from its likely tokens only, or None where they may not hold its nucleus.
    Every token outside the candidates is less likely than every candidate, so once the candidates hold
    top_p of the mass the nucleus is among them; the arithmetic after that is _sample_filtered's (float64
    cumulative sums in descending order), so the pick is the same. One row at a time in numpy: over a
    49k vocabulary torch's topk and friends cost ~0.5 ms per token, mostly thread hand-offs."""
    candidates = np.flatnonzero(probs >= probs.max() * NUCLEUS_CUT)
    if len(candidates) > MAX_CANDIDATES:
        return None
    values = probs[candidates].astype(np.float64)
    if values.sum() < top_p + 1e-6:  # a margin for the different order of summation
        return None
    order = np.argsort(-values, kind="stable")
    candidates, values = candidates[order], values[order]
    cumulative = np.cumsum(values)
    values[(cumulative - values) >= top_p] = 0.0
    cdf = np.cumsum(values)
    return int(candidates[min(int((cdf < draw * cdf[-1]).sum()), len(values) - 1)])


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
