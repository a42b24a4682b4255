"""Issue #39, DeltaSoup: what a hostile pass found, each case as the user meets it.

- a contribution of constant 1e20 (finite in float32) turned the geometric median into NaN and took the whole
  reward pool under mean and trimmed mean: every aggregator must stay finite on finite input, and a norm screen
  sets such contributions aside before any aggregator (gym.soup.screen);
- three ids sending one delta took the pool under median, Krum and byzantine_robust and pushed the honest users
  out: near-copies now enter as one point and share one share;
- `gym soup contribute --samples 10**20` ended in a traceback, as did `gym soup init min_contributors=abc`.

The honest users share a task: the conftest's shared direction plus their own noise of the same size (each at
cosine about 0.7 to the task), the way fine-tunes of one task agree.
"""

from __future__ import annotations

import json

import pytest
import torch

from gym.cli import main as gym_main
from gym.core.errors import ConfigError, OutputError
from gym.soup import aggregators as agg
from gym.soup.aggregators import AggregationMethod, aggregate
from gym.soup.sources import InMemorySource

METHODS = [m.value for m in AggregationMethod]
HONEST_NOISE = 1.0  # each honest delta: the task's direction plus as much of its own


def _vectors(count: int, d: int = 3000, seed: int = 0) -> list[torch.Tensor]:
    """`count` honest vectors sharing a direction (cosine about 0.7 to it), as deltas of one task."""
    gen = torch.Generator().manual_seed(seed)
    shared = torch.randn(d, generator=gen)
    shared /= shared.norm()
    own = torch.randn(count, d, generator=gen)
    return list(shared + HONEST_NOISE * own / own.norm(dim=1, keepdim=True))


def _source(rows: list[torch.Tensor]) -> InMemorySource:
    return InMemorySource([{"w": r.reshape(30, -1), "b": r[:7].clone()} for r in rows])


def _kwargs(method: str, n: int) -> dict:
    return {"weights": [1.0 + i % 3 for i in range(n)]} if method == "weighted_mean" else {}


def _finite(delta: dict[str, torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(v).all()) for v in delta.values())


# -- every aggregator, finite on finite input, the 1e20 contribution set aside ------------------------------------

@pytest.mark.parametrize("method", METHODS)
def test_every_aggregator_stays_finite_and_sets_a_constant_1e20_contribution_aside(method):
    honest = _vectors(5)
    rows = [*honest, torch.full_like(honest[0], 1e20)]
    result = aggregate(_source(rows), method, **_kwargs(method, 6))
    assert _finite(result.delta)
    assert result.screened == [5] and 5 not in result.selected and result.weights[5] == 0.0
    # The attacker is gone as if it had never come: the aggregate of the honest five, bit for bit close.
    alone = aggregate(_source(honest), method, **_kwargs(method, 5))
    for name, value in alone.delta.items():
        torch.testing.assert_close(result.delta[name], value, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scale", [3e38, 1e-30], ids=["float32 top", "float32 bottom"])
@pytest.mark.parametrize("method", METHODS)
def test_every_aggregator_is_scale_invariant_up_to_the_ends_of_float32(method, scale):
    # Nothing is screened (the screen is relative); the squares overflow (3e38^2) or underflow (1e-60) float32,
    # which used to give an infinite Gram matrix (Krum, Weiszfeld: NaN) and an infinite median / trimmed mean.
    honest = _vectors(6, seed=1)
    peak = max(float(r.abs().max()) for r in honest)
    big = [(r.double() * (scale / peak)).float() for r in honest]  # the factor itself is beyond float32
    result = aggregate(_source(big), method, **_kwargs(method, 6))
    plain = aggregate(_source(honest), method, **_kwargs(method, 6))
    assert _finite(result.delta) and result.screened == [] and result.selected == plain.selected
    for name, value in plain.delta.items():
        torch.testing.assert_close(result.delta[name].double() * (peak / scale), value.double(), rtol=1e-4, atol=1e-6)


def test_the_gram_matrix_of_extreme_rows_is_finite_and_as_accurate_as_for_ordinary_ones():
    rows = [torch.full((3000,), 1e20), torch.full((3000,), -3e38), torch.full((3000,), 1e-30), torch.ones(3000)]
    gram = agg.gram_matrix(_source(rows))
    flat = torch.stack([torch.cat([r.reshape(-1), r[:7]]).double() for r in rows])
    expected = flat @ flat.T
    assert bool(torch.isfinite(gram).all())
    # float32 products over a chunk (the module's precision note): a few 1e-6 of each entry, at any scale.
    torch.testing.assert_close(gram, expected, rtol=1e-5, atol=0)


def test_the_norm_screen_keeps_a_tenfold_spread_and_a_minority_cannot_move_it():
    from gym.soup.screen import norm_screen

    assert norm_screen([1.0, 2.0, 5.0, 9.0, 0.2], 10.0) == []  # honest fine-tunes differ a few times in norm
    assert norm_screen([1.0, 1.2, 0.9, 11.0, 0.05, 0.0], 10.0) == [3, 4, 5]  # too big, too small, nothing at all
    assert norm_screen([1.0, 1.0, 1.0, 1e20, 1e20], 10.0) == [3, 4]  # two of five cannot move the median
    assert norm_screen([0.0, 0.0], 10.0) == [0, 1]


def test_near_copies_are_grouped_as_cliques_and_a_chain_does_not_pull_others_in():
    from gym.soup.screen import duplicate_groups

    base = _vectors(1, seed=2)[0]
    turn = torch.randn(base.shape, generator=torch.Generator().manual_seed(3))
    turn = turn - (turn @ base) / (base @ base) * base
    turn *= float(base.norm()) / float(turn.norm())

    def at(angle: float) -> torch.Tensor:  # base turned by `angle` radians
        return torch.cos(torch.tensor(angle)) * base + torch.sin(torch.tensor(angle)) * turn

    other = _vectors(1, seed=4)[0]
    # 0 and 1 exact copies, 2 a scaled copy (cosine is all that counts), 3 and 4 a chain away from 0:
    # 0-3 and 3-4 are within 0.999 (0.035 rad), 0-4 is not (0.07 rad).
    rows = [base, base.clone(), 3 * base, at(0.035), at(0.07), other]
    source = _source(rows)
    groups = duplicate_groups(agg.gram_matrix(source), range(6), 0.999)
    assert [0, 1, 2, 3] in groups and [4] in groups and [5] in groups


@pytest.mark.parametrize("method", METHODS)
def test_copies_enter_every_aggregator_as_one_point(method):
    honest = _vectors(5, seed=5)
    sybil = torch.randn(honest[0].shape, generator=torch.Generator().manual_seed(6))
    sybil *= float(honest[0].norm()) / float(sybil.norm())
    kwargs = {"weights": [1.0] * 8} if method == "weighted_mean" else {}
    three = aggregate(_source([*honest, sybil, sybil.clone(), sybil.clone()]), method, **kwargs)
    once = aggregate(_source([*honest, sybil]), method, **({"weights": [1.0] * 6} if kwargs else {}))
    assert three.groups == [[5, 6, 7]]
    for name, value in once.delta.items():
        torch.testing.assert_close(three.delta[name], value, rtol=1e-5, atol=1e-6)
    assert three.weights[:5] == pytest.approx(once.weights[:5])
    assert three.weights[5:] == pytest.approx([once.weights[5] / 3] * 3)  # the one point's weight, split


# -- in a soup: who is included, who is paid ------------------------------------------------------------------------

def _paid(soup) -> tuple[dict[str, float], dict[str, str], dict[str, str | None]]:
    records = soup.contributions(round_id=1)
    return (soup.calculate_rewards(), {r.user_id: r.status for r in records},
            {r.user_id: r.reason for r in records})


@pytest.mark.parametrize("method", METHODS)
def test_a_constant_1e20_contribution_is_excluded_and_earns_nothing(make_soup, honest, direction, method):
    soup = make_soup(method=method)
    for i in range(3):
        soup.contribute(f"honest{i}", honest(i, noise=HONEST_NOISE))
    assert soup.contribute("mallory", {n: torch.full(v.shape, 1e20) for n, v in direction.items()}).accepted
    released = soup.aggregate()
    assert _finite(released)
    paid, status, reason = _paid(soup)
    assert status["mallory"] == "excluded" and "norm screen" in str(reason["mallory"])
    assert paid["mallory"] == 0.0
    assert sum(paid[f"honest{i}"] for i in range(3)) == pytest.approx(1000.0)  # the whole pool, to the honest
    kept = [status[f"honest{i}"] == "accepted" for i in range(3)]
    assert sum(kept) == (1 if method == "krum" else 3)  # Krum keeps one by design; the others keep all three


@pytest.mark.parametrize("method", METHODS)
def test_three_ids_sending_one_delta_share_one_share_and_cannot_push_the_honest_out(make_soup, honest, noise,
                                                                                    method):
    soup = make_soup(method=method)
    for i in range(3):
        soup.contribute(f"honest{i}", honest(i, noise=HONEST_NOISE))
    size = sum(float(v.pow(2).sum()) for v in honest(0, noise=HONEST_NOISE).values()) ** 0.5
    agenda = noise(11, norm=size)  # a direction of their own, at the honest norm
    for j in range(3):
        soup.contribute(f"sybil{j}", agenda)
    assert _finite(soup.aggregate())
    paid, status, _ = _paid(soup)
    honest_paid = sum(paid[f"honest{i}"] for i in range(3))
    assert honest_paid > 500.0, paid  # the majority of the pool (before: 0 under median, Krum, byzantine_robust)
    assert len({paid[f"sybil{j}"] for j in range(3)}) == 1  # one share, split equally
    assert 3 * paid["sybil0"] <= min(paid[f"honest{i}"] for i in range(3) if status[f"honest{i}"] == "accepted")
    if method == "krum":  # one pick: an honest one
        assert [status[f"honest{i}"] for i in range(3)].count("accepted") == 1
    else:
        assert all(status[f"honest{i}"] == "accepted" for i in range(3))
    info = soup.store.rounds()[-1].info
    assert info["groups"] == [[3, 4, 5]]  # recorded with the round (indices into its contributions)


@pytest.mark.parametrize("method", ["mean", "median", "byzantine_robust"])
def test_copiers_of_an_honest_delta_split_its_share_and_take_nothing_from_the_others(make_soup, honest, method):
    clean = make_soup("clean", method=method)
    copied = make_soup("copied", method=method)
    for i in range(3):
        clean.contribute(f"honest{i}", honest(i, noise=HONEST_NOISE))
        copied.contribute(f"honest{i}", honest(i, noise=HONEST_NOISE))
    for j in range(2):
        copied.contribute(f"copier{j}", honest(0, noise=HONEST_NOISE))
    clean.aggregate()
    copied.aggregate()
    before, after = clean.calculate_rewards(), copied.calculate_rewards()
    group = after["honest0"] + after["copier0"] + after["copier1"]
    assert after["honest0"] == pytest.approx(after["copier0"]) == pytest.approx(after["copier1"])
    assert group == pytest.approx(before["honest0"], rel=1e-4)  # honest0's share, no more
    for i in (1, 2):
        assert after[f"honest{i}"] == pytest.approx(before[f"honest{i}"], rel=1e-4)


def test_krums_single_pick_has_quality_one_whatever_the_rounding():
    # The pick is all of the aggregate, so its quality compares it with the aggregate itself. That case was
    # recognised by "the aggregate without it is 0", which float32 rounding (about 1e-7 of |A|^2) rarely
    # makes true: the pick got a random cosine (below 0.99 in 8 of these 20 rounds; 0 pays nobody).
    from gym.soup import payouts

    for seed in range(20):
        rows = _vectors(5, seed=seed)
        source = _source(rows)
        gram = agg.gram_matrix(source)
        result = aggregate(source, "krum", gram=gram)
        quality = payouts.qualities(source, result.delta, result.weights, result.selected, gram)
        assert quality[result.selected[0]] == pytest.approx(1.0, abs=1e-6), seed


@pytest.mark.parametrize("method", ["mean", "trimmed_mean"])
def test_under_privacy_the_mean_keeps_everyone_once_and_its_sensitivity(make_soup, honest, direction, noise,
                                                                         method):
    # Their noise is calibrated to every contribution being in, once (2C/n): no screen and no merging there;
    # clipping bounds the 1e20 one, and rewards still pay the copies one share.
    soup = make_soup(method=method, differential_privacy=True, noise_seed=0, min_contributors=1)
    for i in range(3):
        soup.contribute(f"honest{i}", honest(i, noise=HONEST_NOISE))
    soup.contribute("mallory", {n: torch.full(v.shape, 1e20) for n, v in direction.items()})
    agenda = noise(12, norm=1.4)
    for j in range(2):
        soup.contribute(f"sybil{j}", agenda)
    assert _finite(soup.aggregate())
    paid, status, _ = _paid(soup)
    assert set(status.values()) == {"accepted"}
    round_ = soup.store.rounds()[-1]
    if method == "mean":
        assert round_.privacy["sensitivity"] == pytest.approx(2 * 1.0 / 6)
    assert round_.info["groups"] == [[4, 5]]
    assert paid["sybil0"] == pytest.approx(paid["sybil1"])
    assert sum(paid[f"honest{i}"] for i in range(3)) > 500.0, paid


def test_under_privacy_robust_methods_still_screen_on_the_norms_before_clipping(make_soup, honest, direction):
    soup = make_soup(method="byzantine_robust", differential_privacy=True, noise_seed=0)
    for i in range(3):
        soup.contribute(f"honest{i}", honest(i, noise=HONEST_NOISE))
    soup.contribute("mallory", {n: torch.full(v.shape, 1e20) for n, v in direction.items()})
    assert _finite(soup.aggregate())
    paid, status, reason = _paid(soup)
    assert status["mallory"] == "excluded" and "norm screen" in str(reason["mallory"]) and paid["mallory"] == 0.0
    assert soup.store.rounds()[-1].privacy["sensitivity"] == pytest.approx(2.0)  # a convex combination: 2C


# -- the doors: no traceback, exit 2, nothing recorded -------------------------------------------------------------

def _status(soup_path, capsys) -> dict:
    assert gym_main(["soup", "status", str(soup_path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("samples", [str(10**20), str(2**63), str(2**53 + 1), "0"])
def test_samples_beyond_what_the_ledger_holds_exit_2_and_record_nothing(tiny_model_dir, make_finetune, tmp_path,
                                                                       capsys, samples):
    soup = tmp_path / "soup"
    assert gym_main(["soup", "init", str(soup), "--base", str(tiny_model_dir)]) == 0
    tuned = make_finetune(lambda name, p: p.add_(1e-3) if ".layers." in name and p.ndim == 2 else None)
    capsys.readouterr()
    before = _status(soup, capsys)
    assert gym_main(["soup", "contribute", str(soup), str(tuned), "--user", "a", "--samples", samples]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gym: error: num_samples (gym soup contribute --samples) must be a whole number")
    assert "Traceback" not in err and err.count("\n") == 1
    assert _status(soup, capsys) == before
    assert gym_main(["soup", "contribute", str(soup), str(tuned), "--user", "a", "--samples", str(2**53)]) == 0


@pytest.mark.parametrize("value", [True, 0, -3, 10**20, 2**53 + 1, 1.5, "12"])
def test_num_samples_out_of_range_or_kind_is_a_config_error(make_soup, honest, value):
    soup = make_soup()
    with pytest.raises(ConfigError, match="num_samples"):
        soup.contribute("a", honest(0), num_samples=value)
    assert soup.contributions() == []


@pytest.mark.parametrize("option, fragment", [
    ("min_contributors=abc", "min_contributors must be a whole number"),
    ("max_contributors=1e30", "max_contributors must be a whole number"),  # YAML reads 1e30 as a string
    ("validation_max_samples=x", "validation_max_samples must be a whole number"),
    ("differential_privacy=maybe", "differential_privacy must be true or false"),
    ("reward_pool=.inf", "reward_pool must be a finite number"),
    ("noise_seed=100000000000000000000", "noise_seed must be null or a whole number"),
    ("norm_screen_ratio=1", "norm_screen_ratio must be above 1"),
    ("max_norm=abc", "max_norm must be a finite number or null"),
])
def test_soup_options_of_the_wrong_kind_exit_2_and_create_nothing(tiny_model_dir, tmp_path, capsys, option,
                                                                  fragment):
    soup = tmp_path / "soup"
    assert gym_main(["soup", "init", str(soup), "--base", str(tiny_model_dir), option]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gym: error: ") and fragment in err and err.count("\n") == 1
    assert not soup.exists()


def test_aggregating_over_the_soups_own_base_is_refused_and_the_round_stays_open(tiny_model_dir, honest, tmp_path,
                                                                                 capsys):
    """A base Gym wrote (a merge, an earlier aggregate) passes --overwrite's check: it must still not be replaced,
    or every later contribution is measured against base + aggregate."""
    import shutil

    from gym.core.files import write_manifest
    from gym.soup import DeltaSoup, DeltaSoupConfig

    base = tmp_path / "merged-base"
    # the shared tiny model may hold the fast engine's pack cache, made by a test before this one
    shutil.copytree(tiny_model_dir, base, ignore=shutil.ignore_patterns(".*"))
    write_manifest(base, {"made_by": "gym merge"})

    def files() -> dict[str, bytes]:
        return {f.name: f.read_bytes() for f in base.iterdir() if f.is_file()}

    before = files()
    soup = DeltaSoup(DeltaSoupConfig(method="mean", min_contributors=1), path=tmp_path / "soup", base_model=str(base))
    soup.contribute("alice", honest(0))
    for out in (base, tmp_path):  # the base itself, and a folder that holds it
        assert gym_main(["soup", "aggregate", str(tmp_path / "soup"), "-o", str(out), "--overwrite"]) == 2
        err = capsys.readouterr().err
        assert err.count("gym: error:") == 1 and f"the input {base}" in err and "Traceback" not in err
    assert files() == before
    with pytest.raises(OutputError, match="is the input"):
        DeltaSoup(path=tmp_path / "soup").aggregate(output_dir=base, overwrite=True)
    assert gym_main(["soup", "aggregate", str(tmp_path / "soup"), "-o", str(tmp_path / "out")]) == 0  # still open
    assert (tmp_path / "out" / "config.json").is_file()
    with pytest.raises(OutputError, match="is the input"):
        DeltaSoup(path=tmp_path / "soup").write_model(base, overwrite=True)
    assert files() == before


def test_a_lora_adapter_with_nan_is_recorded_as_rejected_not_raised(tiny_model_dir, make_soup, tmp_path):
    """Adapters now load through load_peft_adapter, which refuses NaN and damaged files with a ModelError: for a
    soup that is a contribution to reject with the reason (docs/soup.md), not an error that records nothing."""
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    adapter = tmp_path / "nan-lora"
    get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                   LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False)).save_pretrained(adapter)
    weights = load_file(adapter / "adapter_model.safetensors")
    name = next(n for n in weights if "lora_B" in n)
    weights[name][0, 0] = float("nan")
    save_file(weights, adapter / "adapter_model.safetensors")
    soup = make_soup(method="mean", min_contributors=1)
    record = soup.contribute("mallory", str(adapter))
    assert record.status == "rejected" and "NaN or inf" in record.reason and name in record.reason
    assert [r.status for r in soup.contributions()] == ["rejected"]
