"""DeltaSoup aggregators against Byzantine contributions: which ones keep the honest direction?

Honest contributions are one shared direction (norm 1) plus each contributor's own Gaussian noise of norm
--noise (1.7 gives each honest contribution a cosine of about 0.5 to the honest mean, what we see between
users' fine-tunes). A fraction (10%, 20%, 30%) of the n contributions is replaced by attackers, who see
the honest contributions (the usual omniscient assumption) and collude:

- sign_flip: -4 x a genuine delta of their own (they train honestly, then flip and boost);
- scaled:    model replacement (Bagdasaryan et al., 2020): one shared backdoor direction, norm 50 x honest;
- gaussian:  i.i.d. noise of norm 30 x honest;
- alie:      "a little is enough" (Baruch et al., 2019): honest mean - z * honest std, per coordinate, with
             z = Phi^-1((n - s) / n), s = floor(n/2 + 1) - f;
- ipm_0.1, ipm_10: inner-product manipulation (Xie et al., 2019): -eps x honest mean; eps = 0.1 is the
             paper's setting against median/Krum, eps = 10 its setting against the mean;
- zeros:     free riders sending nothing;
- mimic:     attackers that look like honest users (same norm, same noise) but share another direction:
             only their grouping gives them away;
- inlier:    one shared backdoor direction at the honest median norm, sent by every attacker: no farther
             from the honest contributions than they are from each other, and a tight cluster, which
             Krum scores favour. Adaptive attacks against the byzantine_robust filter look like this.

Every aggregator runs with its defaults (num_byzantine=None: f = floor((n-3)/2); trimmed_mean trims 10%),
as a user who does not configure them gets. The "candidate" columns are compositions tried for
byzantine_robust (built from the same public pieces); the shipped byzantine_robust is the winner.
Score: cosine between the aggregate and the mean of the honest contributions (the baseline, computed in the
same run); "resisted" = cosine >= 0.9.

    python bench/soup_attacks.py [--n 20] [--d 10000] [--noise 1.7] [--seed 0]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable

import torch

from gym.soup.aggregators import (
    AggregateResult,
    aggregate,
    default_byzantine,
    gram_matrix,
    krum_scores,
    norms,
    scaled_gram,
)
from gym.soup.sources import DeltaSource, InMemorySource, ScaledSource, SubsetSource

FRACTIONS = (0.1, 0.2, 0.3)
RESISTED = 0.9


def honest_deltas(count: int, d: int, noise: float, gen: torch.Generator) -> torch.Tensor:
    shared = torch.randn(d, generator=gen, dtype=torch.float64)
    shared /= shared.norm()
    own = torch.randn(count, d, generator=gen, dtype=torch.float64)
    return shared + noise * own / own.norm(dim=1, keepdim=True)


def attackers(kind: str, honest: torch.Tensor, n: int, f: int, noise: float, gen: torch.Generator) -> torch.Tensor:
    d = honest.shape[1]
    mean, scale = honest.mean(0), float(honest.norm(dim=1).mean())
    if kind == "sign_flip":
        return -4 * honest_deltas(f, d, noise, gen)
    if kind == "scaled":
        direction = torch.randn(d, generator=gen, dtype=torch.float64)
        return (50 * scale * direction / direction.norm()).expand(f, d)
    if kind == "gaussian":
        return 30 * scale * torch.randn(f, d, generator=gen, dtype=torch.float64) / math.sqrt(d)
    if kind == "alie":
        s = math.floor(n / 2 + 1) - f
        z = float(torch.special.ndtri(torch.tensor((n - s) / n, dtype=torch.float64)))
        return (mean - z * honest.std(0)).expand(f, d)
    if kind.startswith("ipm_"):
        return (-float(kind[4:]) * mean).expand(f, d)
    if kind == "zeros":
        return torch.zeros(f, d, dtype=torch.float64)
    if kind == "mimic":  # honest_deltas draws a fresh shared direction: the attackers' own agenda
        return honest_deltas(f, d, noise, gen)
    if kind == "inlier":
        direction = torch.randn(d, generator=gen, dtype=torch.float64)
        return (float(honest.norm(dim=1).median()) * direction / direction.norm()).expand(f, d)
    raise ValueError(kind)


def _median_clip(source: DeltaSource) -> tuple[ScaledSource, torch.Tensor]:
    gram = gram_matrix(source)
    size = norms(gram)
    limit = float(size.median())
    scales = [1.0 if s <= limit or s == 0 else limit / s for s in size.tolist()]
    return ScaledSource(source, scales), scaled_gram(gram, scales)


def clip_multi_krum(source: DeltaSource) -> AggregateResult:
    clipped, gram = _median_clip(source)
    return aggregate(clipped, "multi_krum", gram=gram)


def clip_multi_krum_trim(source: DeltaSource) -> AggregateResult:
    clipped, gram = _median_clip(source)
    chosen = aggregate(clipped, "multi_krum", gram=gram).selected
    return aggregate(SubsetSource(clipped, chosen), "trimmed_mean")


def clip_geometric_median(source: DeltaSource) -> AggregateResult:
    clipped, gram = _median_clip(source)
    return aggregate(clipped, "geometric_median", gram=gram)


def clip_mean(source: DeltaSource) -> AggregateResult:
    clipped, gram = _median_clip(source)
    return aggregate(clipped, "mean", gram=gram)


def filtered(tau: float, method: str) -> Callable[[DeltaSource], AggregateResult]:
    def run(source: DeltaSource) -> AggregateResult:
        scores = krum_scores(gram_matrix(source), default_byzantine(len(source)))
        keep = [i for i, s in enumerate(scores.tolist()) if s <= tau * float(scores.median())]
        clipped, gram = _median_clip(SubsetSource(source, keep))
        return aggregate(clipped, method, gram=gram)
    return run


AGGREGATORS: dict[str, Callable[[DeltaSource], AggregateResult]] = {
    name: (lambda source, name=name: aggregate(source, name))
    for name in ("mean", "median", "trimmed_mean", "krum", "multi_krum", "geometric_median", "byzantine_robust")
}
CANDIDATES: dict[str, Callable[[DeltaSource], AggregateResult]] = {
    "clip+mean": clip_mean,
    "clip+mkrum": clip_multi_krum,
    "clip+mkrum+trim": clip_multi_krum_trim,
    "clip+gm": clip_geometric_median,
    "filter+clip+gm": filtered(2, "geometric_median"),
    "filter+clip+trim": filtered(2, "trimmed_mean"),
    "filter1.5+clip+mean": filtered(1.5, "mean"),
    "filter3+clip+mean": filtered(3, "mean"),
}
ATTACKS = ("sign_flip", "scaled", "gaussian", "alie", "ipm_0.1", "ipm_10", "zeros", "mimic", "inlier")


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(a.double() @ b.double() / (a.double().norm() * b.double().norm()).clamp_min(1e-30))


def run_case(kind: str, frac: float, args: argparse.Namespace, methods: dict) -> dict[str, float]:
    gen = torch.Generator().manual_seed(args.seed)
    f = 0 if kind == "none" else round(frac * args.n)
    honest = honest_deltas(args.n - f, args.d, args.noise, gen)
    rows = honest if f == 0 else torch.cat([honest, attackers(kind, honest, args.n, f, args.noise, gen)])
    # Attackers go first in a shuffled order: nothing may depend on their position.
    order = torch.randperm(args.n, generator=gen)
    source = InMemorySource([{"w": rows[i].float().reshape(100, -1)} for i in order.tolist()])
    target = honest.mean(0)
    return {name: cosine(fn(source).delta["w"].flatten(), target) for name, fn in methods.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--d", type=int, default=10_000, help="a multiple of 100")
    parser.add_argument("--noise", type=float, default=1.7)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    print("command: python bench/soup_attacks.py " + " ".join(sys.argv[1:]) +
          f"  (n={args.n}, d={args.d}, noise={args.noise}, seed={args.seed})\n")
    methods = {**AGGREGATORS, **CANDIDATES}
    start = time.perf_counter()
    cases = [("none", 0.0)] + [(kind, frac) for kind in ATTACKS for frac in FRACTIONS]
    results = {case: run_case(*case, args, methods) for case in cases}

    names = list(methods)
    header = ["attack", "byz"] + [n + (" (candidate)" if n in CANDIDATES else "") for n in names]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for (kind, frac), scores in results.items():
        cells = [f"{scores[n]:.3f}" + ("" if scores[n] >= RESISTED else " ✗") for n in names]
        print(f"| {kind} | {frac:.0%} | " + " | ".join(cells) + " |")
    attacked = [scores for (kind, _), scores in results.items() if kind != "none"]
    resisted = {n: sum(s[n] >= RESISTED for s in attacked) for n in names}
    print(f"\nResistance (cosine to the honest mean >= {RESISTED}) over {len(attacked)} attacked cases; "
          "honest-only cosine; worst attacked cosine:\n")
    print("| aggregator | resisted | rate | no attack | worst |")
    print("|---|---|---|---|---|")
    for n in sorted(names, key=lambda n: (-resisted[n], -results[("none", 0.0)][n])):
        worst = min(s[n] for s in attacked)
        print(f"| {n} | {resisted[n]}/{len(attacked)} | {resisted[n] / len(attacked):.0%} | "
              f"{results[('none', 0.0)][n]:.3f} | {worst:.3f} |")
    print(f"\n{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
