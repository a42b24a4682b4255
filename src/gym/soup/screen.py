"""What a round looks like before any aggregator counts it: outsized norms set aside, near-copies counted once.

Two attacks need no cleverness, only size or numbers, and every aggregator fell to one of them (issue #39,
bench/soup_attacks.py --table capture):

- size: one contribution of constant 1e20 took the whole reward pool under mean and trimmed_mean, out-earned
  the honest users under median, and turned the geometric median into NaN. The **norm screen** sets aside
  every contribution whose whole-model L2 norm is more than `ratio` times the round's median norm, or less
  than the median over `ratio` (an all-zero delta is always set aside: it changes nothing). The median is
  taken over log-norms (the geometric mean of the two middle norms for an even count), so fewer than half of
  the contributions cannot move it. Honest fine-tunes of one base with different learning rates or step
  counts differ by a few times in norm; the default ratio of 10 leaves room for that.
- numbers: three ids sending one delta took the whole pool under median, Krum and byzantine_robust, and
  pushed the honest users out of byzantine_robust (their Krum scores looked bad next to three points at
  distance 0). **Near-copies** (cosine above DUPLICATE_COSINE between two contributions) are grouped; each
  group enters the aggregator as one point, the mean of its members, and is paid one share, split equally
  between its members. We chose splitting over paying the copies nothing: it does not depend on who was
  first (an attacker can be first), two honest users who happen to send the same delta are both paid, and a
  copier of someone else's delta takes part of that user's share but never more than it.

Groups are cliques: every pair in a group is a near-copy. Linking pairs transitively instead would let a
chain of contributions, each within the threshold of the next, pull an honest user into an attacker's group.
Limits: a sybil who perturbs each copy just past the threshold is counted several times again; ids are not
an identity system (docs/soup.md).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import torch

NORM_RATIO = 10.0  # set aside norms more than this many times from the round's median norm, either way
DUPLICATE_COSINE = 0.999  # two contributions at least this close in direction count as one


def median_norm(norms: Sequence[float]) -> float:
    """The screen's centre: the median of the non-zero norms taken over their logs (0 when all are zero)."""
    logs = [math.log(v) for v in norms if v > 0]
    return math.exp(statistics.median(logs)) if logs else 0.0


def norm_screen(norms: Sequence[float], ratio: float) -> list[int]:
    """Indices of the contributions whose norm is outside [median / ratio, median * ratio] (or zero)."""
    if not ratio > 1:
        raise ValueError(f"the norm screen's ratio must be above 1, got {ratio}")
    centre = median_norm(norms)
    if centre == 0:
        return list(range(len(norms)))
    width = math.log(ratio)
    return [i for i, v in enumerate(norms) if not v > 0 or abs(math.log(v) - math.log(centre)) > width]


def duplicate_groups(gram: torch.Tensor, indices: Sequence[int], cosine: float) -> list[list[int]]:
    """`indices` partitioned into groups of near-copies (pairwise cosine > `cosine`), each sorted, ordered by
    their first member. gram: the Gram matrix over all contributions (gym.soup.aggregators.gram_matrix).

    Greedy cliques: the contribution with the most near-copies opens a group (ties: lowest index), which then
    takes every remaining one that is a near-copy of all its members, in the same order.
    """
    chosen = list(indices)
    if len(chosen) < 2:
        return [[i] for i in chosen]
    sub = gram[chosen][:, chosen]
    size = sub.diagonal().clamp_min(0).sqrt()
    denominator = size[:, None] * size[None, :]
    close = (sub > cosine * denominator) & (denominator > 0)
    close.fill_diagonal_(False)
    near: list[set[int]] = [set() for _ in chosen]
    for a, b in torch.nonzero(close).tolist():
        near[a].add(b)
    order = sorted(range(len(chosen)), key=lambda a: (-len(near[a]), chosen[a]))
    rank = {a: r for r, a in enumerate(order)}
    assigned: set[int] = set()
    groups = []
    for a in order:
        if a in assigned:
            continue
        group = [a]
        for b in sorted(near[a] - assigned, key=rank.__getitem__):
            if all(b in near[m] for m in group):
                group.append(b)
        assigned.update(group)
        groups.append(sorted(chosen[m] for m in group))
    return sorted(groups)
