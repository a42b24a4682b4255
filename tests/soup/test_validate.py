"""The validation-loss check on the tiny model: a destructive delta is turned away, a harmless one let in."""

from __future__ import annotations

import torch


def _noise(params, std: float, seed: int = 0) -> dict[str, torch.Tensor]:
    """Gaussian noise on every matrix (the embedding included: the random tiny base's loss is ln(vocab) whatever
    its blocks do, so only logits made large and random can make it worse)."""
    generator = torch.Generator().manual_seed(seed)
    return {n: torch.randn(p.shape, generator=generator) * std for n, p in params.items() if p.ndim == 2}


def test_a_destructive_contribution_is_rejected_for_its_loss_and_a_harmless_one_accepted(make_soup, data_dir):
    soup = make_soup(validation_dataset="tiny_alpaca", validation_dataset_dir=str(data_dir),
                     validation_max_samples=8, validation_cutoff_len=48, quality_threshold=0.05)
    params = soup.base.params
    before = {n: p.clone() for n, p in params.items()}
    harmful = soup.contribute("vandal", _noise(params, 5.0))
    harmless = soup.contribute("careful", _noise(params, 1e-6, seed=1))
    assert harmful.status == "rejected"
    assert "validation loss" in harmful.reason and "quality_threshold" in harmful.reason
    assert harmful.info["validation_loss"] > harmful.info["base_validation_loss"] * 1.05
    assert harmless.accepted and harmless.info["validation_loss"] <= harmless.info["base_validation_loss"] * 1.05
    assert all(torch.equal(before[n], p) for n, p in params.items())  # the check restores the base exactly


def test_a_negative_threshold_demands_an_improvement(make_soup, data_dir):
    soup = make_soup(validation_dataset="tiny_alpaca", validation_dataset_dir=str(data_dir),
                     validation_max_samples=4, validation_cutoff_len=48, quality_threshold=-0.5)
    record = soup.contribute("careful", _noise(soup.base.params, 1e-6))
    assert record.status == "rejected" and "validation loss" in record.reason


def test_without_validate_contributions_neither_loss_nor_norm_is_checked(make_soup, data_dir):
    soup = make_soup(validate_contributions=False, validation_dataset="tiny_alpaca",
                     validation_dataset_dir=str(data_dir), max_norm=1e-3)
    record = soup.contribute("vandal", _noise(soup.base.params, 5.0))
    assert record.accepted and "validation_loss" not in record.info


def test_max_norm_rejects_a_delta_above_the_bound(make_soup):
    soup = make_soup(max_norm=1.0)
    params = soup.base.params
    name = "model.layers.0.mlp.up_proj.weight"
    big = soup.contribute("big", {name: torch.full(params[name].shape, 1.0)})
    small = soup.contribute("small", {name: torch.full(params[name].shape, 1e-4)})
    assert big.status == "rejected" and "above max_norm" in big.reason
    assert small.accepted and small.norm < 1.0
