"""DeltaSoup: many fine-tunes of one base -> one community delta, robust to attackers, private, paid.

    soup = DeltaSoup(DeltaSoupConfig(), path="my-soup", base_model="smollm2-135m")
    soup.contribute(user_id="alice", model="saves/alice-lora")      # -> ContributionRecord (status, reason)
    delta = soup.aggregate(min_contributors=3, output_dir="soup-model")
    soup.calculate_rewards()                                          # -> {"alice": 397.0, ...}

A round: the open round's accepted contributions are read back from their blobs as one stream
(gym.soup.aggregators' DeltaSource), clipped to clip_norm when differential_privacy is on, merged by
config.method, noised (Gaussian mechanism, gym.soup.privacy), and recorded with its privacy cost, its
rewards and the contributors' new reputation; then the next round opens. Everything lives in the soup
folder (gym.soup.store), so a soup survives restarts and several processes may contribute at once.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from gym.core.errors import ConfigError
from gym.core.files import refuse_output_over_input, refuse_overwrite
from gym.delta.apply import save_model_folder
from gym.delta.bitdelta import BitDeltaQuantizer
from gym.delta.compress import reconstruct
from gym.delta.format import save_delta
from gym.delta.safety import gate_dense
from gym.delta.weights import Delta, kind_of, load_model
from gym.infer.answers import ModelAnswers
from gym.models.loader import resolve_model_path
from gym.soup import aggregators as agg
from gym.soup import payouts as pay
from gym.soup.config import KRUM_FAMILY, DeltaSoupConfig
from gym.soup.contributions import Base, Rejected, base_of, default_soup_path, l2_norm, to_delta
from gym.soup.privacy import (
    MEMBERSHIP_FIXED,
    PrivacyReport,
    add_gaussian_noise,
    clip_scales,
    gaussian_sigma,
    sensitivity,
    total_privacy,
    zcdp_rho,
)
from gym.soup.screen import DUPLICATE_COSINE, duplicate_groups, median_norm
from gym.soup.sources import ScaledSource
from gym.soup.store import ACCEPTED, LEDGER, REJECTED, ContributionRecord, RoundRecord, Store, source_for
from gym.soup.validate import Validator

logger = logging.getLogger(__name__)

# The most training examples a contribution may claim: the ledger stores the count as an SQLite INTEGER (up to
# 2^63 - 1; 10**20 used to end `gym soup contribute` in a traceback) and weighted_mean multiplies it into a float
# weight, which holds whole numbers exactly up to 2^53.
MAX_SAMPLES = 2**53


class DeltaSoup:
    """A soup folder: `DeltaSoup(config, path=..., base_model=...)` creates it, `DeltaSoup(path=...)` reopens it.

    Reopening with a config replaces the stored one (each round records the method and privacy it used);
    reopening without one uses the stored config. Given on reopening, base_model must be the same base (its
    fingerprint is checked). Without a path the soup lives in `$GYM_HOME/soups/<base name>`, one per base,
    so every process on this machine that contributes to a base's soup meets the same one. Without a base
    either (`DeltaSoup(config)`), the base is learnt from the first contribution
    (a Gym run's manifest, a LoRA adapter's config, a PEFT model) and the soup opens then.
    """

    def __init__(self, config: DeltaSoupConfig | None = None, *, path: str | os.PathLike[str] | None = None,
                 base_model: str | os.PathLike[str] | None = None) -> None:
        self._given_config = config
        self._validator: Any = None
        self._answers: ModelAnswers | None = None  # the base answering the safety gate's set, made once
        if path is not None:
            self._open(Path(path).expanduser(), base_model)
        elif base_model is not None:
            self._open(default_soup_path(base_model), base_model)
        else:
            self.path: Path | None = None  # opened by the first contribution, which names its base
            self.config = config or DeltaSoupConfig()

    def _open(self, path: Path, base_model: str | os.PathLike[str] | None) -> None:
        self.path, config = path, self._given_config
        if (self.path / LEDGER).is_file():
            self.store = Store(self.path)
            stored = DeltaSoupConfig.from_dict(json.loads(self.store.meta("config") or "{}"))
            if config is not None and config.to_dict() != stored.to_dict():
                logger.warning("%s: replacing the stored soup config with the one given.", self.path)
                self.store.set_meta("config", json.dumps(config.to_dict()))
            self.config = config or stored
            self.base = Base(self.store.meta("base_model") or "")
            self._base_checked = False
            if base_model is not None and _normalised(base_model) != self.base.ref:
                self.base = Base(_normalised(base_model))
                self._checked_base()
        else:
            if base_model is None:
                raise ConfigError(f"{self.path} is not a soup yet: give base_model= (the model every contribution "
                                  "was fine-tuned from) to create it.")
            self.config = config or DeltaSoupConfig()
            self.base = Base(_normalised(base_model))
            self.store = Store.create(self.path, {"config": json.dumps(self.config.to_dict()),
                                                  "base_model": self.base.ref,
                                                  "base_fingerprint": self.base.fingerprint})
            self._base_checked = True

    def _opened(self) -> None:
        if self.path is None:
            raise ConfigError("This soup has no contributions yet (it opens with the first one, which names the "
                              "base): contribute first, or give path= / base_model=.")

    def _checked_base(self) -> Base:
        self._opened()
        if not self._base_checked:
            if self.base.fingerprint != self.store.meta("base_fingerprint"):
                raise ConfigError(f"{self.base.ref} is not this soup's base: its fingerprint differs from the one "
                                  f"recorded when {self.path} was created.")
            self._base_checked = True
        return self.base

    # contributions
    def contribute(self, user_id: str, model: Any, num_samples: int | None = None) -> ContributionRecord:
        """Check a contribution and record it in the open round, accepted or rejected with the reason.

        model: a model object, a model folder, a LoRA adapter folder, a Gym delta file or a dict of delta
        tensors (gym.soup.contributions). num_samples: how many training examples it saw (weighted_mean uses it).
        Raises ConfigError only for input that cannot be read; a wrong-but-readable contribution is rejected.
        """
        if not isinstance(user_id, str) or not user_id.strip():
            raise ConfigError(f"user_id must be a non-empty string, got {user_id!r}.")
        if num_samples is not None and (isinstance(num_samples, bool) or not isinstance(num_samples, int)
                                        or not 1 <= num_samples <= MAX_SAMPLES):
            raise ConfigError(f"num_samples (gym soup contribute --samples) must be a whole number from 1 to "
                              f"{MAX_SAMPLES}, or None; got {num_samples!r}.")
        if self.path is None:
            base_model = base_of(model)
            if base_model is None:
                raise ConfigError("DeltaSoup(config) learns its base from the first contribution, and this one does "
                                  "not name it (a model object without a Gym manifest or PEFT config): give "
                                  "base_model= (and path=) when creating the soup.")
            self._open(default_soup_path(base_model), base_model)
        base, config = self._checked_base(), self.config
        info: dict[str, Any] = {}
        norm, blob, status, reason = None, None, ACCEPTED, None
        try:
            converted = to_delta(model, base)
            info.update(source=converted.source, **converted.info)
            delta = converted.delta
            if not delta:
                raise Rejected("identical to the base: it changes nothing")
            encoded = _bitdelta_entries(delta, base) if config.use_bitdelta else None
            if encoded is not None:
                delta = _decoded(encoded)
            norm = l2_norm(delta)
            if config.validate_contributions:
                self._validate(delta, norm, info)
            metadata = {"what": "contribution", "user_id": user_id, "base_fingerprint": base.fingerprint}
            blob = self.store.write_tensors(delta, metadata) if encoded is None else \
                self._write_encoded(encoded, metadata)
        except Rejected as exc:
            status, reason = REJECTED, str(exc)
        record = self.store.add_contribution(user_id, status, reason, norm, num_samples, blob, info,
                                             config.max_contributors)
        logger.info("%s: %s's contribution %s%s", self.path, user_id, record.status,
                    f" ({record.reason})" if record.reason else "")
        return record

    def _validate(self, delta: dict[str, torch.Tensor], norm: float, info: dict[str, Any]) -> None:
        config = self.config
        if config.max_norm is not None and norm > config.max_norm:
            raise Rejected(f"norm {norm:.4g} is above max_norm {config.max_norm:.4g}")
        if config.validation_dataset:
            if self._validator is None:
                self._validator = Validator(self.base, config)
            losses, reason = self._validator.check(delta)
            info.update(losses)
            if reason:
                raise Rejected(reason)
        gate = config.gate()
        if gate is not None:  # last: it answers the safety set twice, the costliest check
            if self._answers is None:
                self._answers = ModelAnswers.for_model(self.base.model, self.base.ref)
            decision = gate_dense(gate, self._answers, delta, base_key=self.base.fingerprint)
            info["safety_gate"] = decision.to_dict()
            if not decision.passed:
                raise Rejected(decision.message())

    def _write_encoded(self, entries: dict[str, Any], metadata: dict[str, Any]) -> str:
        header = {"method": "bitdelta", "options": {"storage": "deltasoup"},
                  "base": {"fingerprint": self.base.fingerprint, "name": self.base.ref}, "gym_soup": metadata}
        return self.store.write_blob(lambda tmp: save_delta(tmp, entries, header))

    def contributions(self, round_id: int | None = None) -> list[ContributionRecord]:
        self._opened()
        return self.store.contributions(round_id)

    # rounds
    def aggregate(self, min_contributors: int | None = None, output_dir: str | os.PathLike[str] | None = None,
                  overwrite: bool = False) -> dict[str, torch.Tensor]:
        """Merge the open round's accepted contributions, record the round, open the next one.

        Returns the released delta {parameter name: tensor} (noised when differential_privacy is on).
        output_dir: also write base + delta there as a model folder (an existing one only with `overwrite`).
        """
        self._opened()
        if output_dir is not None:  # refused before the round closes, not after
            self._refuse_output(Path(output_dir).expanduser(), overwrite)
        config = self.config
        method = agg.AggregationMethod(config.method).value
        round_id, everyone, rows = self._open_round(config.min_contributors if min_contributors is None
                                                    else min_contributors)
        merged = self._merge(rows)
        result, n = merged.result, len(rows)
        released, privacy = result.delta, None
        if config.differential_privacy:
            released, privacy = self._add_noise(result.delta, n, merged.weights, merged.num_byzantine, round_id,
                                                weights_fixed=all(r.num_samples is None for r in rows))
        quality = pay.qualities(merged.source, result.delta, result.weights, result.selected, merged.gram,
                                merged.groups)
        blob = self.store.write_tensors(released, {"what": "aggregate", "round": round_id,
                                                   "method": method})
        record = RoundRecord(
            round_id, method, n, [r.id for r in rows], [rows[i].id for i in result.selected],
            [float(w) for w in result.weights], privacy, blob,
            _jsonable({"num_byzantine": merged.num_byzantine, "norms": merged.norms, "groups": merged.groups,
                       "clip_scales": merged.clip_scales, "quality": quality, "aggregator": result.info}),
            time.time())
        chosen, screened = set(result.selected), set(result.screened)
        centre = median_norm(merged.norms)
        excluded = {r.id: (f"norm {merged.norms[i]:.3g} is more than {config.norm_screen_ratio:g} times from the "
                           f"round's median norm {centre:.3g} (norm screen, round {round_id})") if i in screened
                    else f"not selected by {method} in round {round_id}"
                    for i, r in enumerate(rows) if i not in chosen}
        rewards, reputation = self._settle(everyone, rows, quality, chosen, merged.groups)
        self.store.close_round(record, max(r.id for r in everyone), excluded, rewards, reputation)
        logger.info("%s: round %d aggregated %d contributions with %s (%d selected).", self.path, round_id, n,
                    method, len(result.selected))
        if output_dir is not None:
            self.write_model(output_dir, round_id, overwrite=overwrite)
        return released

    def _open_round(self, need: int) -> tuple[int, list[ContributionRecord], list[ContributionRecord]]:
        """(round id, every contribution in it, the accepted ones), or a ConfigError that counts them."""
        round_id = self.store.open_round()
        everyone = self.store.contributions(round_id)
        rows = [r for r in everyone if r.status == ACCEPTED]
        if len(rows) < max(need, 1):
            counts = {s: sum(r.status == s for r in everyone) for s in {r.status for r in everyone}}
            raise ConfigError(f"Round {round_id} has {len(rows)} accepted contribution(s) "
                              f"({', '.join(f'{v} {k}' for k, v in sorted(counts.items())) or 'none at all'}); "
                              f"aggregating needs at least {need} (min_contributors).")
        return round_id, everyone, rows

    def _merge(self, rows: list[ContributionRecord]) -> _Merged:
        """The accepted deltas as one stream, clipped under DP, merged by config.method (before noise)."""
        config, n = self.config, len(rows)
        source: Any = source_for([self.store.blob_path(str(r.blob)) for r in rows])
        gram = agg.gram_matrix(source)
        norms = [float(v) for v in agg.norms(gram)]
        scales = [1.0] * n
        if config.differential_privacy:
            scales = list(clip_scales(norms, config.clip_norm))
            source, gram = ScaledSource(source, scales), agg.scaled_gram(gram, scales)
        weights = None
        if config.method == agg.AggregationMethod.WEIGHTED_MEAN:
            reputation = self.store.reputation()
            weights = pay.mean_weights([reputation.get(r.user_id) for r in rows], [r.num_samples for r in rows],
                                       pay.newcomer_reputation(list(reputation.values())))
        # byzantine_threshold sets the f of the Krum scores (krum, multi_krum, byzantine_robust) as a share of the
        # points they score (near-copies count once); trimmed_mean trims by trim_percent, which the aggregator
        # would ignore if it were given an f.
        share = config.byzantine_threshold if config.method in KRUM_FAMILY else None
        # Under DP, the mean's, weighted mean's and trimmed mean's noise is calibrated to every contribution being
        # in, once (gym.soup.privacy): no screen or merging of copies there; clipping already bounds each one's
        # size. Rewards still pay a group of copies one share.
        fixed = config.differential_privacy and config.method in MEMBERSHIP_FIXED
        result = agg.aggregate(source, config.method, byzantine_share=share, trim_percent=config.trim_percent,
                               weights=weights, gram=gram, screen_ratio=None if fixed else config.norm_screen_ratio,
                               screen_norms=norms, duplicate_cosine=None if fixed else DUPLICATE_COSINE)
        groups = duplicate_groups(gram, range(n), DUPLICATE_COSINE) if fixed else result.groups
        groups = [g for g in groups if len(g) > 1]
        return _Merged(result, source, gram, norms, scales, weights, result.info.get("num_byzantine"), groups)

    def _add_noise(self, delta: dict[str, torch.Tensor], n: int, weights: list[float] | None,
                   num_byzantine: int | None, round_id: int,
                   weights_fixed: bool = True) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        config = self.config
        if config.method == agg.AggregationMethod.WEIGHTED_MEAN and not weights_fixed:
            # Self-reported num_samples travel with the contribution, so replacing one contributor moves every
            # weight: only the bound of a convex combination of clipped inputs (2C) still holds.
            bound = 2 * config.clip_norm
        else:
            bound = sensitivity(config.method, config.clip_norm, n, weights, num_byzantine=num_byzantine,
                                trim_percent=config.trim_percent)
        sigma = gaussian_sigma(config.privacy_epsilon, config.privacy_delta, bound)
        seed = secrets.randbits(63) if config.noise_seed is None else config.noise_seed + round_id
        noised = add_gaussian_noise(delta, sigma, generator=torch.Generator().manual_seed(seed))
        report = PrivacyReport(epsilon=config.privacy_epsilon, delta=config.privacy_delta, sigma=sigma,
                               sensitivity=bound, rho=zcdp_rho(bound, sigma))
        return noised, asdict(report)

    def _settle(self, everyone: list[ContributionRecord], rows: list[ContributionRecord], quality: list[float],
                selected: set[int], groups: list[list[int]],
                ) -> tuple[list[tuple[str, int, float, float, float]], dict[str, float]]:
        """Rewards rows and new reputations for everyone who contributed in the round (near-copies: one share)."""
        config = self.config
        participation = pay.participation(quality, sorted(selected), groups)
        amounts = pay.split(quality, participation, config.reward_pool, config.quality_weight,
                            config.participation_weight, groups) if config.enable_rewards else [0.0] * len(rows)
        rewards = [(r.user_id, r.id, q, p, a) for r, q, p, a in zip(rows, quality, participation, amounts)]
        paid = {r.user_id for r in rows}
        for r in everyone:  # rejected in this round, with no accepted contribution: on the books with 0
            if r.status == REJECTED and r.user_id not in paid:
                rewards.append((r.user_id, r.id, 0.0, 0.0, 0.0))
                paid.add(r.user_id)
        previous = self.store.reputation()
        by_user = {user: 0.0 for user, *_ in rewards}
        by_user.update({r.user_id: q for r, q in zip(rows, quality)})
        reputation = {user: pay.updated_reputation(previous.get(user), q, config.reputation_decay)
                      for user, q in by_user.items()}
        return (rewards if config.enable_rewards else []), reputation

    def write_model(self, output_dir: str | os.PathLike[str], round_id: int | None = None,
                    overwrite: bool = False) -> Path:
        """base + a round's released aggregate (default: the last round) as a model folder with the tokenizer."""
        record = self._round(round_id)
        out = Path(output_dir).expanduser()
        self._refuse_output(out, overwrite)
        delta = self.store.read_tensors(record.aggregate_blob)
        model = load_model(self._checked_base().ref)
        params = dict(model.named_parameters())
        with torch.no_grad():
            for name, value in delta.items():
                params[name].add_(value.to(params[name].dtype))
        return save_model_folder(model, resolve_model_path(self.base.ref), out, {
            "made_by": "gym soup aggregate", "base_model": self.base.ref, "soup": str(self.path), "round": record.id,
            "method": record.method, "contributors": record.n, "privacy": record.privacy}, overwrite=overwrite)

    def _refuse_output(self, out: Path, overwrite: bool) -> None:
        # A base that is itself a Gym-written folder (a merge, an earlier aggregate) passes refuse_overwrite's
        # check, and --overwrite would replace the model every contribution is measured against.
        assert self.path is not None  # opened
        refuse_output_over_input(out, [self.base.ref, resolve_model_path(self.base.ref), self.path])
        refuse_overwrite(out, overwrite, folder=True)

    def _round(self, round_id: int | None) -> RoundRecord:
        self._opened()
        rounds = self.store.rounds()
        if not rounds:
            raise ConfigError(f"{self.path} has no aggregated round yet: run aggregate first.")
        if round_id is None:
            return rounds[-1]
        for record in rounds:
            if record.id == round_id:
                return record
        raise ConfigError(f"{self.path} has no round {round_id} (rounds: 1 to {rounds[-1].id}).")

    # rewards and status
    def calculate_rewards(self, round_id: int | None = None, cumulative: bool = False) -> dict[str, float]:
        """{user_id: amount} paid by a round (default: the last); cumulative=True sums every round."""
        if not self.config.enable_rewards:
            raise ConfigError("Rewards are off for this soup (enable_rewards=False).")
        rows = self.store.rewards() if cumulative else self.store.rewards(self._round(round_id).id)
        if cumulative and not self.store.rounds():
            raise ConfigError(f"{self.path} has no aggregated round yet: run aggregate first.")
        totals: dict[str, float] = {}
        for row in rows:
            totals[row["user_id"]] = totals.get(row["user_id"], 0.0) + row["amount"]
        return totals

    def reputation(self) -> dict[str, float]:
        self._opened()
        return self.store.reputation()

    def status(self) -> dict[str, Any]:
        """Rounds, contributions by status (all and in the open round), and the privacy spent so far."""
        self._opened()
        rounds, everyone = self.store.rounds(), self.store.contributions()
        open_round = self.store.open_round()

        def by_status(rows: list[ContributionRecord]) -> dict[str, int]:
            return {s: sum(r.status == s for r in rows) for s in sorted({r.status for r in rows})}

        reports = [PrivacyReport(**r.privacy) for r in rounds if r.privacy]
        return {
            "path": str(self.path), "base_model": self.base.ref,
            "method": agg.AggregationMethod(self.config.method).value,
            "open_round": open_round, "rounds": len(rounds),
            "contributions": by_status(everyone),
            "open_round_contributions": by_status([r for r in everyone if r.round == open_round]),
            "contributors": len({r.user_id for r in everyone}),
            "privacy": {"differential_privacy": self.config.differential_privacy,
                        "per_round": [{"round": r.id, **r.privacy} for r in rounds if r.privacy],
                        "total": total_privacy(reports, self.config.privacy_delta) if reports else None},
        }


@dataclass
class _Merged:
    result: agg.AggregateResult
    source: Any  # the DeltaSource that was aggregated (clipped under DP)
    gram: torch.Tensor  # its Gram matrix
    norms: list[float]  # each contribution's L2 norm before clipping
    clip_scales: list[float]
    weights: list[float] | None  # weighted_mean's weights
    num_byzantine: int | None
    groups: list[list[int]]  # near-copies, paid one share per group (gym.soup.screen)


def _normalised(ref: str | os.PathLike[str]) -> str:
    """A folder reference as an absolute path (a soup is reopened from anywhere); names and hub ids as given."""
    path = Path(ref).expanduser()
    return str(path.resolve()) if path.exists() else str(ref)


def _bitdelta_entries(delta: dict[str, torch.Tensor], base: Base) -> dict[str, Any]:
    """1-bit BitDelta codes for block matrices and embeddings (no scale distillation); others stay dense."""
    quantizer = BitDeltaQuantizer()
    entries: dict[str, Any] = {}
    for name, value in delta.items():
        encoded = quantizer.encode(Delta(name, kind_of(name, base.params[name], base.model), value))
        entries[name] = value if encoded is None else encoded
    return entries


def _decoded(entries: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {name: reconstruct(entry) for name, entry in entries.items()}


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=lambda v: v.tolist() if hasattr(v, "tolist") else str(v)))
