"""Soups on the tiny model, with contributions made by hand so each test knows what is honest and what is not."""

from __future__ import annotations

import pytest
import torch


def block_linears(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {n: p for n, p in params.items() if p.ndim == 2 and ".layers." in n}


@pytest.fixture(scope="session")
def base_params(tiny_model_dir) -> dict[str, torch.Tensor]:
    from gym.delta.weights import load_model, parameters

    return {name: value.clone() for name, value in parameters(load_model(str(tiny_model_dir))).items()}


@pytest.fixture(scope="session")
def direction(base_params) -> dict[str, torch.Tensor]:
    """What the honest users agree on: one fixed delta over every block matrix, norm about 1."""
    generator = torch.Generator().manual_seed(1)
    raw = {n: torch.randn(p.shape, generator=generator) for n, p in block_linears(base_params).items()}
    total = sum(float(v.pow(2).sum()) for v in raw.values()) ** 0.5
    return {n: v / total for n, v in raw.items()}


@pytest.fixture(scope="session")
def honest(direction):
    """honest(i, noise=0.3) -> the shared direction plus user i's own seeded noise (relative size `noise`)."""

    def make(i: int, noise: float = 0.3) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(100 + i)
        raw = {n: torch.randn(v.shape, generator=generator) for n, v in direction.items()}
        total = sum(float(v.pow(2).sum()) for v in raw.values()) ** 0.5
        return {n: v + noise * raw[n] / total for n, v in direction.items()}

    return make


@pytest.fixture()
def make_soup(tiny_model_dir, tmp_path):
    """make_soup(name="soup", **config fields) -> a DeltaSoup on the tiny model in tmp_path/name."""
    from gym.soup import DeltaSoup, DeltaSoupConfig

    def make(name: str = "soup", **fields) -> DeltaSoup:
        return DeltaSoup(DeltaSoupConfig(**fields), path=tmp_path / name, base_model=str(tiny_model_dir))

    return make


@pytest.fixture(scope="session")
def noise(direction):
    """noise(seed, norm) -> a pure Gaussian delta over the same matrices, of the given whole-model norm."""

    def make(seed: int, norm: float) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        raw = {n: torch.randn(v.shape, generator=generator) for n, v in direction.items()}
        total = sum(float(v.pow(2).sum()) for v in raw.values()) ** 0.5
        return {n: v * norm / total for n, v in raw.items()}

    return make
