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

Every aggregator runs with its defaults (num_byzantine=None: f = floor((n-3)/2); trimmed_mean trims 10%; the
norm screen and the counting of near-copies once, gym.soup.screen), as a user who does not configure them gets.
scaled, alie, ipm, zeros and inlier send one vector from every attacker: exact copies, which the screen now
counts once; --jitter gives each attacker noise of its own, the cheap way around that. The "candidate"
columns are compositions tried for byzantine_robust (built from the same public pieces); the shipped
byzantine_robust is the winner.
Score: cosine between the aggregate and the mean of the honest contributions (the baseline, computed in the
same run); "resisted" = cosine >= 0.9.

Second table (``--table capture``; both tables by default): reward capture and non-finite aggregates,
through a real DeltaSoup (ledger, statuses, rewards) on a tiny random Llama made on the fly. --honest
honest users share one task (a shared direction plus their own noise of relative size --capture-noise; 1.0
gives each a cosine of about 0.7 to the task) and each attack is run against every aggregator:

- size_1e20:   one contributor sends a delta of constant 1e20 (finite in float32);
- sybil_x3:    three ids send the same delta (a direction of their own, at the honest norm);
- gm_1e20:     the size attack against geometric_median alone, the case where the aggregate turned NaN
               (it is also a row of size_1e20; kept apart because it was reported apart).

For each: is the released aggregate finite, how many honest and attacking contributions were included
(accepted and not excluded), and each side's share of the round's reward pool (or the error the round
was refused with).

    python bench/soup_attacks.py [--n 20] [--d 10000] [--noise 1.7] [--seed 0] [--jitter 0.05]
    python bench/soup_attacks.py --table capture [--honest 3] [--capture-noise 1.0]
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

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
    bad = attackers(kind, honest, args.n, f, args.noise, gen) if f else honest[:0]
    if args.jitter and f:  # a generator of its own: the honest rows and the order stay those of the plain run
        noise = torch.randn(bad.shape, generator=torch.Generator().manual_seed(args.seed + 1000), dtype=torch.float64)
        bad = bad + args.jitter * bad.norm(dim=1, keepdim=True) * noise / noise.norm(dim=1, keepdim=True)
    rows = torch.cat([honest, bad])
    # Attackers go first in a shuffled order: nothing may depend on their position.
    order = torch.randperm(args.n, generator=gen)
    source = InMemorySource([{"w": rows[i].float().reshape(100, -1)} for i in order.tolist()])
    target = honest.mean(0)
    return {name: cosine(fn(source).delta["w"].flatten(), target) for name, fn in methods.items()}


CAPTURE_ATTACKS = ("size_1e20", "sybil_x3", "gm_1e20")


def tiny_base(folder: Path) -> Path:
    """A 2-layer random Llama (no tokenizer: the soup only reads its weights)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one "Loading weights" bar per soup would bury the table
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def capture_contributions(kind: str, shapes: dict[str, tuple[int, ...]], honest: int, noise: float,
                          seed: int, jitter: float = 0.0) -> list[tuple[str, dict[str, torch.Tensor]]]:
    """(user id, delta) pairs: `honest` users sharing a task, then the attackers of `kind`."""
    gen = torch.Generator().manual_seed(seed)

    def unit() -> dict[str, torch.Tensor]:
        raw = {n: torch.randn(s, generator=gen) for n, s in shapes.items()}
        total = sum(float(v.pow(2).sum()) for v in raw.values()) ** 0.5
        return {n: v / total for n, v in raw.items()}

    task = unit()
    users = []
    for i in range(honest):
        own = unit()
        users.append((f"honest{i}", {n: task[n] + noise * own[n] for n in shapes}))
    size = sum(float(v.pow(2).sum()) for v in users[0][1].values()) ** 0.5
    if kind in ("size_1e20", "gm_1e20"):
        users.append(("attacker", {n: torch.full(s, 1e20) for n, s in shapes.items()}))
    elif kind == "sybil_x3":
        agenda = unit()
        for j in range(3):  # with --jitter each copy adds noise of its own (no longer near-copies)
            own = unit()
            users.append((f"sybil{j}", {n: size * (v + jitter * own[n]) for n, v in agenda.items()}))
    else:
        raise ValueError(kind)
    return users


def capture_case(kind: str, method: str, base: Path, work: Path, args: argparse.Namespace) -> dict[str, str]:
    from gym.core.errors import GymError
    from gym.delta.weights import load_model
    from gym.soup import DeltaSoup, DeltaSoupConfig

    params = {n: tuple(p.shape) for n, p in load_model(str(base)).named_parameters() if p.ndim == 2 and ".layers." in n}
    soup = DeltaSoup(DeltaSoupConfig(method=method, min_contributors=3), path=work / f"{kind}-{method}",
                     base_model=str(base))
    users = capture_contributions(kind, params, args.honest, args.capture_noise, args.seed, args.jitter)
    for user, delta in users:
        soup.contribute(user, delta)
    row = {"attack": kind, "method": method}
    try:
        released = soup.aggregate()
    except GymError as exc:
        return {**row, "finite": "-", "honest in": "-", "attackers in": "-", "honest reward": "-",
                "attacker reward": "-", "note": f"refused: {exc}"}
    except Exception as exc:  # the "before" code: what the user got instead of an answer
        return {**row, "finite": "-", "honest in": "-", "attackers in": "-", "honest reward": "-",
                "attacker reward": "-", "note": f"crash: {type(exc).__name__}: {exc}"[:120]}
    finite = all(bool(torch.isfinite(v).all()) for v in released.values())
    status = {r.user_id: r.status for r in soup.contributions(round_id=1)}
    paid = soup.calculate_rewards()
    pool = sum(paid.values())
    honest_ids = [u for u, _ in users if u.startswith("honest")]
    attacker_ids = [u for u, _ in users if not u.startswith("honest")]
    honest_paid = sum(paid.get(u, 0.0) for u in honest_ids)
    return {**row, "finite": "yes" if finite else "**NO**",
            "honest in": f"{sum(status[u] == 'accepted' for u in honest_ids)}/{len(honest_ids)}",
            "attackers in": f"{sum(status[u] == 'accepted' for u in attacker_ids)}/{len(attacker_ids)}",
            "honest reward": f"{honest_paid / pool:.0%}" if pool else "nothing paid",
            "attacker reward": f"{(pool - honest_paid) / pool:.0%}" if pool else "nothing paid", "note": ""}


def capture_table(args: argparse.Namespace) -> None:
    print(f"Reward capture: {args.honest} honest users sharing a task (noise {args.capture_noise}), seed "
          f"{args.seed}, sybil jitter {args.jitter}, through DeltaSoup (min_contributors=3, every other field "
          "default)\n")
    start = time.perf_counter()
    methods = ("mean", "weighted_mean", "median", "trimmed_mean", "krum", "multi_krum", "geometric_median",
               "byzantine_robust")
    with tempfile.TemporaryDirectory() as tmp:
        base = tiny_base(Path(tmp) / "base")
        rows = [capture_case(kind, method, base, Path(tmp), args) for kind in CAPTURE_ATTACKS
                for method in (("geometric_median",) if kind == "gm_1e20" else methods)]
    columns = ["attack", "method", "finite", "honest in", "attackers in", "honest reward", "attacker reward", "note"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(row[c] for c in columns) + " |")
    print(f"\n{time.perf_counter() - start:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--d", type=int, default=10_000, help="a multiple of 100")
    parser.add_argument("--noise", type=float, default=1.7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jitter", type=float, default=0.0,
                        help="resistance table: each attacker adds noise of this share of its norm, so colluders that "
                        "send one vector are no longer exact copies (0.05: cosine about 0.9975 between them, under "
                        "the 0.999 at which gym.soup.screen counts copies once); in the capture table, the sybils")
    parser.add_argument("--table", choices=("both", "resistance", "capture"), default="both")
    parser.add_argument("--honest", type=int, default=3, help="capture table: honest users")
    parser.add_argument("--capture-noise", type=float, default=1.0, help="capture table: honest users' own noise")
    args = parser.parse_args()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    print("command: python bench/soup_attacks.py " + " ".join(sys.argv[1:]) +
          f"  (n={args.n}, d={args.d}, noise={args.noise}, seed={args.seed}, jitter={args.jitter})\n")
    if args.table in ("both", "resistance"):
        resistance_table(args)
    if args.table in ("both", "capture"):
        capture_table(args)


def resistance_table(args: argparse.Namespace) -> None:
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
    print(f"\n{time.perf_counter() - start:.1f} s\n")


if __name__ == "__main__":
    main()
