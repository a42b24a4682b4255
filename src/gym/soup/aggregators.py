"""Aggregators for DeltaSoup: merge n contributions (each a dict name -> delta tensor) into one delta.

Methods (``AggregationMethod``):

- ``mean`` / ``weighted_mean``: the (weighted) average. Weights (reputation, sample counts) are passed in
  and normalised to sum to 1. No robustness: one contribution can move the mean anywhere.
- ``median``: coordinate-wise median (the average of the two middle values when n is even).
- ``trimmed_mean``: per coordinate, drop the k lowest and k highest values and average the rest
  (Yin et al., 2018). k = num_byzantine when given, else floor(trim_percent * n).
- ``krum``: the one contribution whose squared distances to its n - f - 2 nearest neighbours sum lowest
  (Blanchard et al., 2017); ``multi_krum`` averages the m lowest-scoring ones (default m = n - f).
  Distances are over the whole model, never per tensor. Needs n >= 2f + 3, else a ConfigError: the
  guarantee is gone and silently averaging instead would hide that.
- ``geometric_median``: smoothed Weiszfeld (Pillutla et al., 2019, "RFA"), optionally weighted.
- ``byzantine_robust``: see ``_byzantine_robust`` and the numbers below.

Before any method (``aggregate``; gym.soup.screen): contributions whose norm is more than NORM_RATIO (10) times
from the round's median norm are set aside, and near-copies (cosine > 0.999) enter as one point, the mean of the
group, whose weight is split between its members. f and the trimmed share then count those points. Every method
is finite on finite input: the Gram matrix scales extreme rows by powers of two (see TINY_SQUARE), the median
and trimmed mean divide before they add, and Weiszfeld's smoothing follows the median norm.

f (num_byzantine) defaults to floor((n - 3) / 2), the most attackers Krum can tolerate: an operator who
does not say how many attackers to expect gets the most defensive setting (Multi-Krum then averages about
half the contributions, which costs little accuracy when all are honest; see bench/soup_attacks.py).

Streaming: a ``DeltaSource`` hands out one tensor name at a time, stacked over contributions, so memory is
O(n x largest tensor), never O(n x model). Whole-model geometry comes from the Gram matrix G = X X^T,
built in one pass over names: d2_ij = G_ii + G_jj - 2 G_ij, and the geometric median iterates entirely in
Gram space (z = sum_j w_j x_j, |z - x_i|^2 = w^T G w - 2 (G w)_i + G_ii), so Krum and Weiszfeld need one
pass for G and one pass for the final combination, however many iterations they run.

Precision: each product is float32 (float64 matmul is several times slower on CPU) over at most
GRAM_CHUNK columns, accumulated into a float64 G. The error of an entry is then about 2e-7 of
|x_i| |x_j| (measured by tests/soup/test_aggregators.py and bench/soup_scale.py); a squared distance between two
contributions
much closer to each other than to the origin (|x_i - x_j| < ~1e-3 |x_i|) is correspondingly noisy.
Only the lower block triangle is multiplied (G is symmetric), which saves up to half the flops.

byzantine_robust (``_byzantine_robust``): (1) Krum scores with f as above, so every neighbourhood of
n - f - 2 holds a majority and a far cluster of fewer than n/2 colluders cannot score well; drop every
contribution scoring above ROBUST_SCORE_RATIO (2) times the median score; (2) clip the rest to their
median norm; (3) average them. This is FLAME's recipe (Nguyen et al., 2022: filter, clip to the median
norm, average) with Krum scores in place of its HDBSCAN clustering. Why, measured with
bench/soup_attacks.py before the norm screen and the copy rule existed (issue #39; docs/benchmarks.md has the
numbers with them) (n=20, d=10,000, honest cosine to the honest mean about 0.5; 9 attacks at 10/20/30%
attackers; resisted = cosine to the honest mean >= 0.9):

    resisted of 27 (no-attack cosine)  n=20        n=50        seed 1      noise 0.5   noise 3
    byzantine_robust                   26 (1.000)  26 (1.000)  26 (1.000)  27 (1.000)  24 (1.000)
    geometric_median                   24 (1.000)  24          24          27          17
    multi_krum                         23 (0.961)  24 (0.978)  23 (0.961)  27 (0.996)  17 (0.911)
    clip to median norm + geo. median  24          24          24          27          17
    clip + multi_krum (+ trimmed mean) 21 (20)     21 (20)     21 (20)     27 (27)     14 (14)
    median / trimmed_mean / mean       16/17/14    17/18/14    16/17/14    27/19/16    6/14/12
    krum                               1 (0.551)   1 (0.525)   1 (0.554)   27 (0.901)  1 (0.394)

The filter removes what is far (sign flip x4, model replacement x50, Gaussian noise, IPM eps=10); what
passes sits inside the honest cloud (ALIE, IPM eps=0.1, zeros), where averaging loses least (Multi-Krum
instead *prefers* such points: it keeps the n - f tightest, which at 30% ALIE is half attackers) and
clipping caps each one's pull. The ratio 2 is not fine-tuned: 1.5 gives the same tables; 3 lets the
"inlier" attack through at noise 0.5 (cosine 0.903 against 1.000). Limit, shared by every aggregator
here: that "inlier" attack (30% colluders sending one direction at the honest norm, as close to the
honest points as they are to each other) keeps its 30% share once honest noise is large: cosine 0.79 at
noise 1.7, the same as the plain mean and the best of all tried (Multi-Krum 0.48). Distances alone
cannot tell such contributions from honest ones; validation and reputation must.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch

from gym.core.errors import ConfigError
from gym.core.names import enum_choice
from gym.soup.screen import DUPLICATE_COSINE, NORM_RATIO, duplicate_groups, norm_screen
from gym.soup.sources import DeltaSource, GroupedSource

# On 2 cores at n=1000, d=2^18, 256-row blocks (10 products, 62.5% of the full product's flops) built the
# Gram in 1.8-2.0 s, 500-row blocks in 2.05-2.1 s, one full product in 2.7 s. The chunk bounds how many
# float32 products are summed before the float64 accumulation.
GRAM_CHUNK = 65536  # columns per float32 product
GRAM_BLOCK = 256  # rows per block of the symmetric product (only blocks on or below the diagonal)
# A Gram matrix is trusted when it is finite and every diagonal entry is at least this: float32 products of
# values below ~1e-15 lose digits to subnormals, and squares above ~1e19 (a contribution of constant 1e20) reach
# inf. Otherwise it is built again with each row scaled by a power of two, which is exact, and the products
# scaled back in float64: a second pass over the tensors, paid only by rounds holding such rows.
TINY_SQUARE = 2.0**-100
SMOOTHING = 1e-6  # Weiszfeld's nu, relative to the median contribution norm (RFA uses 1e-6 absolute)
ROBUST_SCORE_RATIO = 2.0  # byzantine_robust drops Krum scores above this many times the median score


class AggregationMethod(str, Enum):
    MEAN = "mean"
    WEIGHTED_MEAN = "weighted_mean"
    MEDIAN = "median"
    TRIMMED_MEAN = "trimmed_mean"
    KRUM = "krum"
    MULTI_KRUM = "multi_krum"
    GEOMETRIC_MEDIAN = "geometric_median"
    BYZANTINE_ROBUST = "byzantine_robust"


def _power_of_two_scaled(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x with row i divided by 2^e_i, 2^e_i in float64): 2^e_i is the power of two at or above the row's
    largest |value|, so every scaled row lies in [-1, 1] and its products cannot overflow or vanish."""
    exponent = torch.frexp(torch.linalg.vector_norm(x, ord=math.inf, dim=1)).exponent  # the largest |value|
    # Two steps of half the exponent each: 2^-e alone can overflow float32 (e = -140 for a row of 1e-42s).
    half = torch.div(exponent, 2, rounding_mode="floor")
    for part in (half, exponent - half):
        x = x * torch.pow(2.0, -part.double()).float()[:, None]
    return x, torch.pow(2.0, exponent.double())


def _add_gram(gram: torch.Tensor, x: torch.Tensor, scaled: bool = False) -> None:
    """gram (lower block triangle) += x x^T for x float32 [n, k], in column chunks and row blocks."""
    n = x.shape[0]
    starts = range(0, n, GRAM_BLOCK)
    for c in range(0, x.shape[1], GRAM_CHUNK):
        xc, scale = _power_of_two_scaled(x[:, c:c + GRAM_CHUNK]) if scaled else (x[:, c:c + GRAM_CHUNK], None)
        for i in starts:
            for j in starts:
                if j > i:
                    break
                block = xc[i:i + GRAM_BLOCK] @ xc[j:j + GRAM_BLOCK].T
                if scale is not None:
                    block = block.double() * (scale[i:i + GRAM_BLOCK, None] * scale[None, j:j + GRAM_BLOCK])
                gram[i:i + GRAM_BLOCK, j:j + GRAM_BLOCK] += block


@torch.no_grad()
def gram_matrix(source: DeltaSource) -> torch.Tensor:
    """G = X X^T over the whole model, float64 [n, n], in one pass over the names (two for extreme values)."""
    n = len(source)
    for scaled in (False, True):
        gram = torch.zeros(n, n, dtype=torch.float64)
        for name in source.names:
            _add_gram(gram, source.stacked(name).reshape(n, -1), scaled)
        # A 0 on the diagonal may be a row of zeros or one whose squares all vanished in float32: only the scaled
        # pass tells (a soup never holds an all-zero contribution; it is rejected as identical to the base).
        if bool(torch.isfinite(gram).all()) and bool((gram.diagonal() >= TINY_SQUARE).all()):
            break
    lower = gram.tril()
    return lower + lower.tril(-1).T


def norms(gram: torch.Tensor) -> torch.Tensor:
    """Whole-model L2 norm of every contribution."""
    return gram.diagonal().clamp_min(0).sqrt()


def scaled_gram(gram: torch.Tensor, scales: Sequence[float]) -> torch.Tensor:
    """The Gram matrix of ScaledSource(source, scales), from the source's own: no pass over the tensors."""
    s = torch.tensor([float(v) for v in scales], dtype=torch.float64)
    return gram * s[:, None] * s[None, :]


def squared_distances(gram: torch.Tensor) -> torch.Tensor:
    """d2_ij = G_ii + G_jj - 2 G_ij, clamped at 0 (rounding can make it slightly negative)."""
    diag = gram.diagonal()
    return (diag[:, None] + diag[None, :] - 2 * gram).clamp_min(0).fill_diagonal_(0)


@dataclass
class AggregateResult:
    delta: dict[str, torch.Tensor]  # float32, same names/shapes as the source
    selected: list[int]  # contributions that entered the aggregate
    weights: list[float]  # per contribution, its weight in the aggregate (0 when excluded)
    info: dict[str, Any] = field(default_factory=dict)  # method-specific: scores, objective trace, ...
    screened: list[int] = field(default_factory=list)  # set aside by the norm screen before the method ran
    groups: list[list[int]] = field(default_factory=list)  # near-copies that entered as one point (2+ members)


@dataclass
class _Options:
    num_byzantine: int | None
    trim_percent: float
    weights: Sequence[float] | None
    multi_krum_m: int | None
    max_iter: int
    tol: float
    gram: torch.Tensor | None

    def gram_of(self, source: DeltaSource) -> torch.Tensor:
        if self.gram is None:
            self.gram = gram_matrix(source)
        return self.gram


def default_byzantine(n: int) -> int:
    """The f used when none is given: floor((n - 3) / 2), the most Krum tolerates."""
    return max(0, (n - 3) // 2)


def trim_count(n: int, num_byzantine: int | None = None, trim_percent: float = 0.1) -> int:
    """Values dropped at each end per coordinate by the trimmed mean."""
    if num_byzantine is not None:
        k = int(num_byzantine)
    elif 0 <= trim_percent < 0.5:
        k = math.floor(trim_percent * n)
    else:
        raise ConfigError(f"trim_percent={trim_percent} must be in [0, 0.5): the share trimmed at each end.")
    if k < 0 or n - 2 * k < 1:
        raise ConfigError(f"Trimming {k} at each end of {n} contributions leaves nothing to average; "
                          "lower byzantine_threshold or trim_percent, or collect more contributions.")
    return k


def _krum_f(n: int, num_byzantine: int | None) -> int:
    f = default_byzantine(n) if num_byzantine is None else int(num_byzantine)
    if f < 0 or n < 2 * f + 3:
        raise ConfigError(f"Krum needs n >= 2f + 3 contributions: got n={n} with f={f} assumed malicious. "
                          "Collect more contributions, lower byzantine_threshold, or choose geometric_median.")
    return f


def krum_scores(gram: torch.Tensor, f: int) -> torch.Tensor:
    """Krum score of each contribution: the sum of squared distances to its n - f - 2 nearest others."""
    n = gram.shape[0]
    d2 = squared_distances(gram).fill_diagonal_(math.inf)
    return d2.topk(n - f - 2, dim=1, largest=False).values.sum(dim=1)


def _lowest(scores: torch.Tensor, m: int) -> list[int]:
    # Ties broken by index: deterministic, and ties only arise between (near-)identical contributions.
    values = scores.tolist()
    return sorted(range(len(values)), key=lambda i: (values[i], i))[:m]


@torch.no_grad()
def combine(source: DeltaSource, weights: Sequence[float]) -> dict[str, torch.Tensor]:
    """sum_i weights[i] * contribution i, one name at a time."""
    w = torch.tensor([float(v) for v in weights], dtype=torch.float32)
    nonzero = torch.nonzero(w).flatten().tolist()
    # A selection (Krum) copies the input bit for bit; a product would also turn an inf elsewhere into nan.
    if len(nonzero) == 1 and w[nonzero[0]] == 1.0:
        return {name: source.stacked(name)[nonzero[0]].clone() for name in source.names}
    return {name: (w @ source.stacked(name).reshape(len(w), -1)).reshape(source.shape(name))
            for name in source.names}


def _per_coordinate(source: DeltaSource, reduce: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: reduce(source.stacked(name).sort(dim=0).values) for name in source.names}


def _median_of_sorted(s: torch.Tensor) -> torch.Tensor:
    n = s.shape[0]
    return s[(n - 1) // 2] / 2 + s[n // 2] / 2  # halved first: two finite values near float32's top sum to inf


def _uniform(n: int, selected: list[int]) -> list[float]:
    chosen = set(selected)
    return [1.0 / len(selected) if i in chosen else 0.0 for i in range(n)]


def _mean(source: DeltaSource, opts: _Options) -> AggregateResult:
    if opts.weights is not None:
        raise ConfigError("mean takes no weights; use weighted_mean.")
    n = len(source)
    return AggregateResult(combine(source, [1.0 / n] * n), list(range(n)), [1.0 / n] * n)


def _normalised(weights: Sequence[float] | None, n: int, method: str) -> list[float]:
    if weights is None or len(weights) != n:
        raise ConfigError(f"{method} needs one weight per contribution ({n}), got "
                          f"{'none' if weights is None else len(weights)}.")
    w = [float(v) for v in weights]
    if any(not math.isfinite(v) or v < 0 for v in w) or sum(w) <= 0:
        raise ConfigError(f"{method} weights must be finite, non-negative and not all zero: {w}.")
    return [v / sum(w) for v in w]


def _weighted_mean(source: DeltaSource, opts: _Options) -> AggregateResult:
    w = _normalised(opts.weights, len(source), "weighted_mean")
    return AggregateResult(combine(source, w), [i for i, v in enumerate(w) if v > 0], w)


def _no_weights(opts: _Options, method: str) -> None:
    if opts.weights is not None:
        raise ConfigError(f"{method} takes no weights (weighted_mean and geometric_median do).")


def _median(source: DeltaSource, opts: _Options) -> AggregateResult:
    _no_weights(opts, "median")
    n = len(source)
    return AggregateResult(_per_coordinate(source, _median_of_sorted), list(range(n)), [1.0 / n] * n)


def _trimmed_mean(source: DeltaSource, opts: _Options) -> AggregateResult:
    _no_weights(opts, "trimmed_mean")
    n = len(source)
    k = trim_count(n, opts.num_byzantine, opts.trim_percent)
    # Divided before summing, like the median: the sum of finite float32 values can overflow, their mean cannot.
    delta = _per_coordinate(source, lambda s: s[k:n - k].div_(n - 2 * k).sum(dim=0))
    return AggregateResult(delta, list(range(n)), [1.0 / n] * n, {"trimmed": k})


def _krum(source: DeltaSource, opts: _Options) -> AggregateResult:
    _no_weights(opts, "krum")
    n = len(source)
    f = _krum_f(n, opts.num_byzantine)
    scores = krum_scores(opts.gram_of(source), f)
    selected = _lowest(scores, 1)
    return AggregateResult(combine(source, _uniform(n, selected)), selected, _uniform(n, selected),
                           {"num_byzantine": f, "scores": scores.tolist()})


def _multi_krum(source: DeltaSource, opts: _Options) -> AggregateResult:
    _no_weights(opts, "multi_krum")
    n = len(source)
    f = _krum_f(n, opts.num_byzantine)
    m = n - f if opts.multi_krum_m is None else int(opts.multi_krum_m)
    if not 1 <= m <= n:
        raise ConfigError(f"multi_krum_m={m} must be between 1 and the number of contributions ({n}).")
    scores = krum_scores(opts.gram_of(source), f)
    selected = sorted(_lowest(scores, m))
    return AggregateResult(combine(source, _uniform(n, selected)), selected, _uniform(n, selected),
                           {"num_byzantine": f, "m": m, "scores": scores.tolist()})


def weiszfeld(gram: torch.Tensor, alpha: Sequence[float] | None = None, max_iter: int = 100,
              tol: float = 1e-6) -> tuple[torch.Tensor, list[float]]:
    """Smoothed Weiszfeld in Gram space: the weights w (z = sum_i w_i x_i) and the objective trace.

    The traced objective is RFA's smoothed sum of distances, sum_i alpha_i |z - x_i|_nu, with
    |u|_nu = |u| when |u| >= nu and |u|^2 / (2 nu) + nu / 2 below; each step minimises a quadratic
    majoriser of it, so it never increases. It equals the plain sum of distances while no iterate
    comes within nu of a contribution. Stops when a step improves it by less than tol (relative).
    """
    n = gram.shape[0]
    a = torch.full((n,), 1.0 / n, dtype=torch.float64) if alpha is None else torch.tensor(alpha, dtype=torch.float64)
    diag = gram.diagonal()
    # The median norm, not the RMS one: one huge contribution would otherwise make nu larger than every honest
    # distance, and the iteration would stop telling the honest points apart.
    nu = SMOOTHING * max(float(diag.clamp_min(0).sqrt().median()), 1e-30)

    def distances(w: torch.Tensor) -> torch.Tensor:
        gw = gram @ w
        return (w @ gw - 2 * gw + diag).clamp_min(0).sqrt()

    def objective(d: torch.Tensor) -> float:
        return float((a * torch.where(d >= nu, d, d * d / (2 * nu) + nu / 2)).sum())

    w = a.clone()
    d = distances(w)
    trace = [objective(d)]
    for _ in range(max_iter):
        beta = a / d.clamp_min(nu)
        w = beta / beta.sum()
        d = distances(w)
        trace.append(objective(d))
        if trace[-2] - trace[-1] <= tol * trace[-1]:
            break
    return w, trace


def _geometric_median(source: DeltaSource, opts: _Options) -> AggregateResult:
    n = len(source)
    alpha = None if opts.weights is None else _normalised(opts.weights, n, "geometric_median")
    w, trace = weiszfeld(opts.gram_of(source), alpha, opts.max_iter, opts.tol)
    weights = w.tolist()
    return AggregateResult(combine(source, weights), [i for i, v in enumerate(weights) if v > 0], weights,
                           {"iterations": len(trace) - 1, "objective_trace": trace})


def _byzantine_robust(source: DeltaSource, opts: _Options) -> AggregateResult:
    """Drop far outliers by Krum score, clip the rest to their median norm, average (module docstring)."""
    _no_weights(opts, "byzantine_robust")
    n = len(source)
    gram = opts.gram_of(source)
    f = _krum_f(n, opts.num_byzantine)
    scores = krum_scores(gram, f)
    cutoff = ROBUST_SCORE_RATIO * float(scores.median())
    kept = [i for i, s in enumerate(scores.tolist()) if s <= cutoff]
    size = norms(gram)[kept]
    limit = float(size.median())
    scales = [0.0] * n
    for i, s in zip(kept, size.tolist()):
        scales[i] = (1.0 if s <= limit else limit / s) / len(kept)
    # The aggregate is sum_i scales_i x_i: each kept contribution, clipped, with weight 1/len(kept).
    info = {"num_byzantine": f, "scores": scores.tolist(), "score_cutoff": cutoff, "clip_norm": limit,
            "clipped": [i for i, s in zip(kept, size.tolist()) if s > limit]}
    return AggregateResult(combine(source, scales), kept, scales, info)


_AGGREGATORS: dict[AggregationMethod, Callable[[DeltaSource, _Options], AggregateResult]] = {
    AggregationMethod.MEAN: _mean,
    AggregationMethod.WEIGHTED_MEAN: _weighted_mean,
    AggregationMethod.MEDIAN: _median,
    AggregationMethod.TRIMMED_MEAN: _trimmed_mean,
    AggregationMethod.KRUM: _krum,
    AggregationMethod.MULTI_KRUM: _multi_krum,
    AggregationMethod.GEOMETRIC_MEDIAN: _geometric_median,
    AggregationMethod.BYZANTINE_ROBUST: _byzantine_robust,
}


def method_of(method: AggregationMethod | str) -> AggregationMethod:
    return enum_choice(AggregationMethod, method, "aggregation method")


@torch.no_grad()
def aggregate(source: DeltaSource, method: AggregationMethod | str, *, num_byzantine: int | None = None,
              byzantine_share: float | None = None, trim_percent: float = 0.1, weights: Sequence[float] | None = None,
              multi_krum_m: int | None = None, max_iter: int = 100, tol: float = 1e-6,
              gram: torch.Tensor | None = None, screen_ratio: float | None = NORM_RATIO,
              screen_norms: Sequence[float] | None = None,
              duplicate_cosine: float | None = DUPLICATE_COSINE) -> AggregateResult:
    """Aggregate the contributions of `source` with `method`.

    Before the method runs (gym.soup.screen): contributions whose norm is more than screen_ratio times from
    the median norm are set aside (`screened`), and near-copies (cosine above duplicate_cosine) enter as one
    point, the mean of the group, whose weight is split equally between its members (`groups`). None turns
    either off. screen_norms: the norms to screen on when they are not the source's own (a soup clipping for
    privacy screens the norms before clipping).

    num_byzantine (f): attackers to tolerate among the points the method sees; byzantine_share: f as that
    share of them instead; neither = default_byzantine for the Krum family, and trim_percent for the trimmed
    mean. weights: weighted_mean and geometric_median only. gram: the source's Gram matrix when the caller
    already has it (saves a pass over the tensors).
    """
    kind = method_of(method)
    n = len(source)
    if n == 0:
        raise ConfigError("Nothing to aggregate: no contributions.")
    if gram is not None and tuple(gram.shape) != (n, n):
        raise ValueError(f"gram has shape {tuple(gram.shape)} for {n} contributions")
    if screen_ratio is None and duplicate_cosine is None:
        return _run(kind, source, gram, weights, num_byzantine, byzantine_share, trim_percent, multi_krum_m,
                    max_iter, tol)
    gram = gram_matrix(source) if gram is None else gram
    sizes = norms(gram).tolist() if screen_norms is None else [float(v) for v in screen_norms]
    screened = [] if screen_ratio is None else norm_screen(sizes, screen_ratio)
    kept = [i for i in range(n) if i not in set(screened)]
    if not kept:
        raise ConfigError(f"Every one of the {n} contributions was set aside by the norm screen (norms "
                          f"{', '.join(f'{v:.3g}' for v in sizes)}: no majority within {screen_ratio:g} times of "
                          "each other); nothing left to aggregate.")
    groups = [[i] for i in kept] if duplicate_cosine is None else duplicate_groups(gram, kept, duplicate_cosine)
    if not screened and len(groups) == n:  # nothing set aside, no copies: the method sees the round as it is
        result = _run(kind, source, gram, weights, num_byzantine, byzantine_share, trim_percent, multi_krum_m,
                      max_iter, tol)
        result.info.update(screened=[], groups=[])
        return result
    mix = torch.zeros(len(groups), n, dtype=torch.float64)
    for g, members in enumerate(groups):
        mix[g, members] = 1.0 / len(members)
    view_weights = None if weights is None else [sum(float(weights[m]) for m in g) / len(g) for g in groups]
    view = GroupedSource(source, groups)
    if len(groups) == 1 and n >= 3 and kind in (AggregationMethod.KRUM, AggregationMethod.MULTI_KRUM,
                                                 AggregationMethod.BYZANTINE_ROBUST):
        # Unanimous (one point after counting copies once): nothing to vote on, and Krum cannot score one point.
        inner = AggregateResult(combine(view, [1.0]), [0], [1.0], {"method": kind.value, "unanimous": True})
    else:
        try:
            inner = _run(kind, view, mix @ gram @ mix.T, view_weights, num_byzantine, byzantine_share, trim_percent,
                         multi_krum_m, max_iter, tol)
        except ConfigError as exc:
            raise ConfigError(f"{exc} (Of the {n} contributions, the norm screen set {len(screened)} aside and "
                              f"near-copies count once: {len(groups)} distinct reached {kind.value}.)") from None
    return _expanded(inner, groups, screened, n)


def _run(kind: AggregationMethod, source: DeltaSource, gram: torch.Tensor | None, weights: Sequence[float] | None,
         num_byzantine: int | None, byzantine_share: float | None, trim_percent: float, multi_krum_m: int | None,
         max_iter: int, tol: float) -> AggregateResult:
    if num_byzantine is None and byzantine_share is not None:
        num_byzantine = math.floor(byzantine_share * len(source))
    opts = _Options(num_byzantine, trim_percent, weights, multi_krum_m, max_iter, tol, gram)
    result = _AGGREGATORS[kind](source, opts)
    result.info.setdefault("method", kind.value)
    return result


def _expanded(inner: AggregateResult, groups: list[list[int]], screened: list[int], n: int) -> AggregateResult:
    """A result over groups as one over the n contributions: each member gets an equal part of its group's weight."""
    weights = [0.0] * n
    for g, members in enumerate(groups):
        for m in members:
            weights[m] = inner.weights[g] / len(members)
    selected = sorted(m for g in inner.selected for m in groups[g])
    info = dict(inner.info)
    if "scores" in info:  # Krum scores are per point: each member shows its group's, screened ones none
        scores: list[float | None] = [None] * n
        for g, members in enumerate(groups):
            for m in members:
                scores[m] = info["scores"][g]
        info["scores"] = scores
    copies = [members for members in groups if len(members) > 1]
    info.update(screened=screened, groups=copies)
    return AggregateResult(inner.delta, selected, weights, info, screened, copies)
