"""gradient_checkpointing: true/false as asked; auto (the default) decided by the estimated activations."""

from __future__ import annotations

import pytest

from gym.train import memory, workflow


@pytest.mark.parametrize(("setting", "free_bytes", "expected"), [
    ("auto", 10**12, False),  # plenty of memory: keep the activations, a third less compute
    ("auto", 10**3, True),  # the activations would not fit: recompute them
    (None, 10**3, True),  # unset is auto
    (True, 10**12, True),
    (False, 10**3, False),
])
def test_gradient_checkpointing_choice(train_config, capture_trainer, monkeypatch, setting, free_bytes, expected):
    from gym.workflows.training import run_exp

    monkeypatch.setattr(memory, "available_memory_bytes", lambda: free_bytes)
    seen = capture_trainer(workflow)
    keys = {} if setting is None else {"gradient_checkpointing": setting}
    run_exp(train_config(max_steps=1, **keys))
    trainer = seen["trainer"]
    assert trainer.args.gradient_checkpointing is expected
    assert trainer.model.get_base_model().is_gradient_checkpointing is expected


def test_activation_estimate_scales_with_tokens_and_layers():
    from types import SimpleNamespace

    config = SimpleNamespace(hidden_size=64, intermediate_size=128, num_hidden_layers=2)
    one = memory.activation_bytes(config, 100)
    assert memory.activation_bytes(config, 200) == 2 * one
    assert memory.activation_bytes(SimpleNamespace(**{**vars(config), "num_hidden_layers": 4}), 100) == 2 * one
