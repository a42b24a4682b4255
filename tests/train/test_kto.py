"""stage: kto on the tiny model: two steps train only the LoRA adapter against the adapter-disabled base,
and the first loss is the closed form of the KTO objective when policy == reference."""

from __future__ import annotations

from pathlib import Path

import pytest

from gym.core.errors import ConfigError
from gym.train.harness import read_log
from gym.train.methods import kto
from gym.workflows.training import run_exp


def test_two_steps_train_only_the_adapter(feedback_config, capture_trainer, assert_only_adapter_trained):
    captured = capture_trainer(kto)
    result = run_exp(feedback_config())
    assert result.global_step == 2
    assert_only_adapter_trained(Path(result.output_dir))
    trainer = captured["trainer"]
    assert trainer.ref_model is None and set(trainer.model.peft_config) == {"default"}
    assert trainer.calculate_KL  # the reference point is estimated from mismatched pairs


def test_first_loss_is_the_weighted_closed_form(feedback_config):
    # policy == reference: every log-ratio and the KL estimate are 0, so each example's loss is
    # 1 - sigmoid(0) = 0.5, times its weight; the batch holds all 16 rows, 8 of each kind.
    result = run_exp(feedback_config(per_device_train_batch_size=16, max_steps=1, kto_chosen_weight=2.0,
                                     kto_rejected_weight=1.0))
    (first,) = [e for e in read_log(result.output_dir) if e.get("step") == 1 and "loss" in e]
    assert first["loss"] == pytest.approx(0.5 * (2.0 * 8 + 1.0 * 8) / 16, abs=1e-5)
    assert first["kl"] == pytest.approx(0.0, abs=1e-6)


def test_rotated_completions_pair_each_prompt_with_another_answer():
    batch = {"prompt_ids": [[1], [2], [3]], "completion_ids": [[10], [20], [30]]}
    assert kto._rotate_completions(batch)["KL_completion_ids"] == [[30], [10], [20]]


@pytest.mark.parametrize(("overrides", "match"), [
    ({"pref_ftx": 0.5}, "'pref_ftx' is not supported by kto"),
    ({"pref_beta": 0.0}, "'pref_beta' must be positive"),
])
def test_config_errors(feedback_config, overrides, match):
    with pytest.raises(ConfigError, match=match):
        run_exp(feedback_config(**overrides))
