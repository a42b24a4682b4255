"""stage: rloo on the tiny model: two steps train only the LoRA adapter, against the adapter-disabled
base as KL reference (no second model), with the options reaching TRL."""

from __future__ import annotations

from pathlib import Path

import pytest

from gym.train import online
from gym.train.harness import read_log
from gym.workflows.training import run_exp


def test_two_steps_train_only_the_adapter(prompt_config, capture_trainer, assert_only_adapter_trained):
    captured = capture_trainer(online)
    result = run_exp(prompt_config(stage="rloo", per_device_train_batch_size=4, num_generations=2))
    assert result.global_step == 2
    assert_only_adapter_trained(Path(result.output_dir))

    trainer = captured["trainer"]
    # beta 0.05 (the default) needs a reference: the base with the adapter disabled.
    assert trainer.beta == pytest.approx(0.05) and trainer.ref_model is None
    assert set(trainer.model.peft_config) == {"default"}
    assert not any(getattr(m, "merged", False) for m in trainer.model.modules())
    assert trainer.num_generations == 2 and (trainer.epsilon_low, trainer.epsilon_high) == (0.2, 0.2)

    log = [e for e in read_log(result.output_dir) if "reward" in e]
    assert len(log) == 2
    # The adapter starts as a no-op, so the first batch is sampled from the reference itself.
    assert log[0]["kl"] == pytest.approx(0.0, abs=1e-4)


def test_options_reach_trl(prompt_config, capture_trainer):
    captured = capture_trainer(online)
    run_exp(prompt_config(stage="rloo", max_steps=1, per_device_train_batch_size=4, num_generations=4, beta=0.0,
                          epsilon=0.1, normalize_advantages=True))
    trainer = captured["trainer"]
    assert trainer.beta == 0.0 and trainer.num_generations == 4 and trainer.epsilon_low == 0.1
    assert trainer.normalize_advantages is True
