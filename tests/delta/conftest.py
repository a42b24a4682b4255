"""Fine-tunes of the tiny model made by hand, so each test knows exactly what changed."""

from __future__ import annotations

import pytest
import torch


def block_linears(model) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if p.ndim == 2 and ".layers." in n}


@pytest.fixture()
def gaussian_finetune(make_finetune):
    """Every block linear moved by a seeded Gaussian delta of std 1e-3 (what a short fine-tune looks like)."""
    generator = torch.Generator().manual_seed(0)

    def change(name, param):
        if param.ndim == 2 and ".layers." in name:
            param.add_(torch.randn(param.shape, generator=generator) * 1e-3)

    return make_finetune(change, "gaussian")


@pytest.fixture()
def models(tiny_model_dir):
    """load(ref) -> a float32 model via Gym's delta loader (folders and LoRA adapters alike)."""
    from gym.delta.weights import load_model

    return lambda ref: load_model(str(ref), str(tiny_model_dir))
