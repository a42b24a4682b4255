"""DeltaSoup end to end on the tiny model: rounds, robustness, privacy, persistence, model output, BitDelta storage."""

from __future__ import annotations

import json

import pytest
import torch

from gym.core.errors import ConfigError
from gym.soup import DeltaSoup


def _flat(delta, names):
    return torch.cat([delta[n].reshape(-1).double() for n in names])


def _norm(delta):
    return sum(float(v.double().pow(2).sum()) for v in delta.values()) ** 0.5


def _attacked_round(soup, honest, direction, noise):
    for i in range(5):
        assert soup.contribute(f"honest{i}", honest(i), num_samples=10).accepted
    soup.contribute("flipper", {n: -4 * v for n, v in direction.items()})
    soup.contribute("noiser", noise(7, norm=9.0))  # inside the norm screen (10x the median): every method sees it


def test_robust_methods_resist_the_attackers_that_pull_the_mean_away(make_soup, honest, direction, noise):
    names = sorted(direction)
    target = _flat(direction, names)
    errors, weights = {}, {}
    for method in ("mean", "multi_krum", "byzantine_robust"):
        soup = make_soup(method, method=method)
        _attacked_round(soup, honest, direction, noise)
        errors[method] = float((_flat(soup.aggregate(), names) - target).norm())
        weights[method] = dict(zip([r.user_id for r in soup.contributions()], soup.store.rounds()[-1].weights))
        if method == "multi_krum":  # f = floor((7 - 3) / 2) = 2 by default: both attackers left out
            status = {r.user_id: r.status for r in soup.contributions()}
            assert status["flipper"] == status["noiser"] == "excluded"
            assert {status[f"honest{i}"] for i in range(5)} == {"accepted"}
    assert errors["mean"] > 1.0 and errors["multi_krum"] < 0.3 and errors["byzantine_robust"] < 0.3
    honest_weight = min(weights["byzantine_robust"][f"honest{i}"] for i in range(5))
    assert max(weights["byzantine_robust"]["flipper"], weights["byzantine_robust"]["noiser"]) < honest_weight / 2


def test_too_few_contributions_is_an_error_that_counts_them(make_soup, honest):
    soup = make_soup(method="median", min_contributors=3)
    soup.contribute("a", honest(0))
    soup.contribute("b", {"nope": torch.ones(1)})
    with pytest.raises(ConfigError, match=r"1 accepted.*1 rejected.*at least 3"):
        soup.aggregate()
    soup.contribute("c", honest(2))
    soup.aggregate(min_contributors=2)  # the argument overrides the config


def test_a_round_closes_and_the_next_one_opens(make_soup, honest):
    soup = make_soup(method="mean", min_contributors=2)
    soup.contribute("a", honest(0))
    soup.contribute("b", honest(1))
    soup.aggregate()
    late = soup.contribute("a", honest(2))
    assert late.round == 2 and soup.store.open_round() == 2
    assert [r.id for r in soup.store.rounds()] == [1]
    status = soup.status()
    assert status["rounds"] == 1 and status["open_round_contributions"] == {"accepted": 1}
    assert status["contributions"] == {"accepted": 3} and status["privacy"]["total"] is None


def test_identical_contributions_and_bad_arguments(make_soup, base_params):
    soup = make_soup()
    record = soup.contribute("idle", {n: torch.zeros_like(p) for n, p in base_params.items()})
    assert record.status == "rejected" and "changes nothing" in record.reason
    with pytest.raises(ConfigError, match="user_id"):
        soup.contribute("", {})
    with pytest.raises(ConfigError, match="num_samples"):
        soup.contribute("a", {}, num_samples=0)


def test_dp_clips_every_contribution_and_the_mean_stays_inside_the_clip(make_soup, honest):
    soup = make_soup(method="mean", differential_privacy=True, clip_norm=0.25, privacy_epsilon=1e9,
                     privacy_delta=1e-5, noise_seed=0)
    for i in range(4):
        soup.contribute(f"u{i}", {n: (i + 1) * v for n, v in honest(i).items()})
    delta = soup.aggregate()
    info = soup.store.rounds()[-1].info
    clipped = [n * s for n, s in zip(info["norms"], info["clip_scales"])]
    assert all(c <= 0.25 * (1 + 1e-9) for c in clipped) and min(info["norms"]) > 0.25
    assert _norm(delta) <= 0.25 + 1e-3  # noise at epsilon 1e9 is negligible


def test_dp_noise_has_the_calibrated_standard_deviation(make_soup, honest):
    contributions = [honest(i) for i in range(4)]
    plain, private = make_soup("plain", method="mean"), make_soup(
        "private", method="mean", differential_privacy=True, clip_norm=10.0, privacy_epsilon=2.0, noise_seed=3)
    for soup in (plain, private):
        for i, delta in enumerate(contributions):
            soup.contribute(f"u{i}", delta)
    clean, noised = plain.aggregate(), private.aggregate()
    names = sorted(clean)
    noise = _flat(noised, names) - _flat(clean, names)
    report = private.store.rounds()[-1].privacy
    assert report["epsilon"] == 2.0 and report["sigma"] > 0
    assert noise.numel() > 10_000 and abs(float(noise.std()) / report["sigma"] - 1) < 0.1
    assert abs(float(noise.mean())) < 0.05 * report["sigma"]


def test_privacy_spent_adds_up_over_rounds(make_soup, honest):
    soup = make_soup(method="mean", differential_privacy=True, min_contributors=2, noise_seed=0)
    for round_ in range(2):
        soup.contribute("a", honest(2 * round_))
        soup.contribute("b", honest(2 * round_ + 1))
        soup.aggregate()
    privacy = soup.status()["privacy"]
    assert [r["round"] for r in privacy["per_round"]] == [1, 2]
    assert privacy["total"]["rounds"] == 2 and privacy["total"]["epsilon"] > privacy["per_round"][0]["epsilon"]


def test_weighted_mean_weighs_by_reputation_times_samples(make_soup, honest):
    soup = make_soup(method="weighted_mean", min_contributors=2)
    soup.contribute("a", honest(0), num_samples=30)
    soup.contribute("b", honest(1), num_samples=10)
    soup.aggregate()
    weights = soup.store.rounds()[-1].weights
    assert weights[0] / weights[1] == pytest.approx(3.0)  # equal (newcomer) reputation, 3x the samples


def test_dp_weighted_mean_with_self_reported_samples_pays_the_convex_bound(make_soup, honest):
    """Reputation weights are fixed before a round (sensitivity 2C·max w); self-reported num_samples are
    part of a contribution, so they would let one contributor move every weight: then only 2C holds."""
    fixed, reported = (make_soup(name, method="weighted_mean", min_contributors=2, differential_privacy=True,
                                 clip_norm=1.0, noise_seed=0) for name in ("fixed", "reported"))
    for i in range(3):
        fixed.contribute(f"u{i}", honest(i))
        reported.contribute(f"u{i}", honest(i), num_samples=10 * (i + 1))
    fixed.aggregate(), reported.aggregate()
    assert fixed.store.rounds()[-1].privacy["sensitivity"] == pytest.approx(2 / 3)
    assert reported.store.rounds()[-1].privacy["sensitivity"] == pytest.approx(2.0)


def test_a_soup_survives_reopening_and_refuses_another_base(make_soup, honest, make_finetune):
    soup = make_soup(method="median", min_contributors=2, reward_pool=10.0)
    soup.contribute("a", honest(0))
    soup.contribute("b", honest(1))
    soup.aggregate()
    again = DeltaSoup(path=soup.path)  # no config, no base: both come from the ledger
    assert again.config == soup.config and again.base.ref == soup.base.ref
    assert again.calculate_rewards() == soup.calculate_rewards()
    assert again.contribute("c", honest(2)).round == 2
    other = make_finetune(lambda n, p: p.add_(0.1), "other-base")
    with pytest.raises(ConfigError, match="not this soup's base"):
        DeltaSoup(path=soup.path, base_model=str(other))
    with pytest.raises(ConfigError, match="base_model"):
        DeltaSoup(path=soup.path.parent / "new")


def test_the_aggregate_is_written_as_a_loadable_model_folder(make_soup, honest, base_params, tmp_path):
    from transformers import AutoModelForCausalLM

    soup = make_soup(method="mean", min_contributors=2)
    soup.contribute("a", honest(0))
    soup.contribute("b", honest(1))
    delta = soup.aggregate(output_dir=tmp_path / "merged")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    params = dict(model.named_parameters())
    for name, value in delta.items():
        assert torch.allclose(params[name], base_params[name] + value, atol=1e-6)
    assert (tmp_path / "merged" / "tokenizer_config.json").is_file()
    manifest = json.loads((tmp_path / "merged" / "gym_manifest.json").read_text())
    assert manifest["round"] == 1 and manifest["method"] == "mean"


def test_use_bitdelta_stores_one_bit_and_aggregates_what_was_stored(make_soup, honest, direction):
    from gym.delta.format import read_header

    dense, packed = make_soup("dense", method="mean", min_contributors=2), make_soup(
        "packed", method="mean", min_contributors=2, use_bitdelta=True)
    for soup in (dense, packed):
        for i in range(2):
            soup.contribute(f"u{i}", honest(i))
    blobs = {soup: [soup.store.blob_path(r.blob) for r in soup.contributions()] for soup in (dense, packed)}
    assert read_header(blobs[packed][0])["method"] == "bitdelta"
    assert blobs[packed][0].stat().st_size * 10 < blobs[dense][0].stat().st_size
    name = next(iter(direction))
    one_bit = packed.aggregate()[name]
    full = dense.aggregate()[name]
    assert one_bit.unique().numel() <= 4  # the mean of two sign patterns of scales a, b: +-(a + b)/2, +-(a - b)/2
    assert torch.nn.functional.cosine_similarity(one_bit.flatten(), full.flatten(), dim=0) > 0.7
