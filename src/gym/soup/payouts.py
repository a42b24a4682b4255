"""Rewards and reputation: paying a round's contributors by measured quality and by participation.

Quality is leave-one-out agreement with the round's aggregate A (before privacy noise). With c_i the weight
contribution i had in A (AggregateResult.weights), A_-i = A - c_i x_i is what everybody else put in, and

    q_i = max(0, cos(x_i, A_-i))   for a contribution the aggregator selected; 0 for excluded or rejected ones

Leaving i out matters: a robust aggregate such as the geometric median keeps every input with some weight,
so a pure-noise delta has a small positive cosine with A through its own share, and none with the others'.
(For median and trimmed mean A is not a weighted sum; c_i = 1/n there removes i's average share. When i is
all of A, as with Krum's pick, A_-i is 0 and plain cos(x_i, A) is used; that case is read from the weights, as
float32 rounding leaves A_-i slightly off 0.) It needs no validation set and costs one streaming pass of dot
products plus the Gram matrix the aggregators already built. Cosine ignores scale, but a contribution large
enough to become A would still have made every honest A_-i point its way: a constant 1e20 delta took the whole
pool under mean and trimmed mean (issue #39). The norm screen sets such contributions aside before A is formed,
so they earn 0. It rewards agreeing with the community rather than helping on a held-out
task; a soup with a validation set checks the latter at the door (gym.soup.validate).

Near-copies (gym.soup.screen: cosine > 0.999 between two contributions) are one contributor here as in the
aggregate: a group is measured as one (its members' sum against A without the whole group, so copies cannot
agree with each other through A), takes part in the median below once, and is paid one share, split equally
between its members. Three ids sending one delta used to be paid three shares, and under median, Krum and
byzantine_robust the whole pool (issue #39). A contribution the norm screen set aside is excluded and earns 0.

Participation p_i is 1 for a selected contribution whose quality is at least PARTICIPATION_FLOOR times the
round's median quality among selected ones (and above 0), else 0: turning up with noise or with the sign
flipped is not participation. A round pays

    amount_i = pool * (wq * q_i / sum(q) + wp * p_i / sum(p)) / (wq + wp)

so the amounts sum to the pool whenever anybody participated; if every q is 0 nobody participated and
nothing is paid. Reputation is an exponential moving average of q, updated for everyone who contributed in
the round (rejected and excluded contributions count as q = 0): r <- decay * r + (1 - decay) * q, starting
at the first measured q. weighted_mean weights a contribution by its author's reputation (times
num_samples when given); a newcomer counts as the median known contributor, so a fresh identity is worth
no more than a typical one (agreement between honest fine-tunes is often far below 1: 0.07 for the LoRA
users of bench/soup_e2e.py, so no fixed prior would fit every soup).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import torch

NEWCOMER_REPUTATION = 1.0  # weighted_mean's weight for newcomers when nobody has a reputation yet (relative)
MIN_WEIGHT = 1e-3  # weighted_mean never gives a contributor exactly 0, so all-zero weights cannot happen
PARTICIPATION_FLOOR = 0.25  # share of the round's median quality a contribution needs to count as participating


def partition(n: int, groups: Sequence[Sequence[int]] | None) -> list[list[int]]:
    """All n indices as groups: the near-copy groups given (gym.soup.screen), everybody else alone."""
    grouped = [list(g) for g in groups or []]
    inside = {i for g in grouped for i in g}
    return sorted(grouped + [[i] for i in range(n) if i not in inside])


def qualities(source: Any, aggregate: dict[str, torch.Tensor], weights: list[float], selected: list[int],
              gram: torch.Tensor, groups: Sequence[Sequence[int]] | None = None) -> list[float]:
    """q_i (module docstring) for every contribution of `source`; gram is the source's Gram matrix.

    A group of near-copies is measured as one: its members' sum against the aggregate without the whole group,
    so copies cannot agree with each other through A; every member gets the group's q.
    """
    n = len(source)
    dots = torch.zeros(n, dtype=torch.float64)  # x_i . A
    aggregate_square = 0.0
    for name in source.names:
        if name in aggregate:
            a = aggregate[name].reshape(-1).double()
            dots += source.stacked(name).reshape(n, -1).double() @ a
            aggregate_square += float(a @ a)
    chosen = set(selected)
    c = torch.tensor([float(w) for w in weights], dtype=torch.float64)
    result = [0.0] * n
    for members in partition(n, groups):
        if not chosen.intersection(members):
            continue
        idx = torch.tensor(members)
        block, own_weights = gram[idx][:, idx], c[idx]
        own_square = float(block.sum())  # |u|^2, u the members' sum
        own_dot = float(dots[idx].sum())  # u . A
        share_dot = float(own_weights @ dots[idx])  # v . A, v = sum of c_m x_m: the group's part of A
        rest_dot = own_dot - float((block @ own_weights).sum())  # u . (A - v)
        rest_square = aggregate_square - 2 * share_dot + float(own_weights @ block @ own_weights)
        others = float(c.sum()) - float(own_weights.sum())
        # The group is all of A (Krum's pick): compare with A itself. Decided by the weights, not by rest_square,
        # whose float32 rounding (about 1e-7 of |A|^2) is not 0 and gave the pick a random cosine.
        if others <= 1e-12 or rest_square <= 1e-9 * max(aggregate_square, 1e-30):
            rest_dot, rest_square = own_dot, aggregate_square
        denominator = (own_square * max(rest_square, 0.0)) ** 0.5
        cosine = rest_dot / denominator if denominator > 0 else 0.0
        for m in members:
            result[m] = max(0.0, min(1.0, cosine))
    return result


def participation(quality: list[float], selected: list[int],
                  groups: Sequence[Sequence[int]] | None = None) -> list[float]:
    """p_i: 1 for a selected contribution with q_i > 0 and q_i >= PARTICIPATION_FLOOR x the selected median,
    the median taken over groups of near-copies counted once."""
    chosen = set(selected)
    firsts = [g[0] for g in partition(len(quality), groups) if chosen.intersection(g)]
    floor = PARTICIPATION_FLOOR * statistics.median([quality[i] for i in firsts]) if firsts else 0.0
    return [1.0 if i in chosen and q > 0 and q >= floor else 0.0 for i, q in enumerate(quality)]


def split(quality: list[float], participation: list[float], pool: float, quality_weight: float,
          participation_weight: float, groups: Sequence[Sequence[int]] | None = None) -> list[float]:
    """Each contributor's share of `pool` (module docstring); all zeros if nobody participated. A group of
    near-copies is paid one share, split equally between its members."""
    parts = [g for g in partition(len(quality), groups) if participation[g[0]]]
    total_q, total_p = sum(quality[g[0]] for g in parts), len(parts)
    if total_p == 0 or total_q == 0:
        return [0.0] * len(quality)
    scale = pool / (quality_weight + participation_weight)
    amounts = [0.0] * len(quality)
    for g in parts:
        share = scale * (quality_weight * quality[g[0]] / total_q + participation_weight / total_p)
        for m in g:
            amounts[m] = share / len(g)
    return amounts


def updated_reputation(previous: float | None, quality: float, decay: float) -> float:
    return quality if previous is None else decay * previous + (1 - decay) * quality


def newcomer_reputation(known: list[float]) -> float:
    """The reputation weighted_mean assumes for someone without one: the median of the known ones."""
    return statistics.median(known) if known else NEWCOMER_REPUTATION


def mean_weights(reputation: list[float | None], num_samples: list[int | None], newcomer: float) -> list[float]:
    """weighted_mean's weight per contribution: reputation (`newcomer` for None) x num_samples (1 if unknown)."""
    return [max(newcomer if r is None else r, MIN_WEIGHT) * (s if s else 1) for r, s in zip(reputation, num_samples)]
