"""stage: grpo / gspo on the tiny model: two steps train only the LoRA adapter, the options reach TRL,
and gspo's importance ratio is one length-normalised ratio per answer (checked on the loss itself)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from gym.core.errors import ConfigError
from gym.train import online
from gym.train.harness import read_log
from gym.train.run import run_training
from gym.workflows.training import run_exp


@pytest.fixture()
def grpo_config(prompt_config):
    def make(**overrides):
        values = dict(stage="grpo", per_device_train_batch_size=4, num_generations=2)
        values.update(overrides)
        return prompt_config(**values)

    return make


@pytest.mark.parametrize("stage", ["grpo", "gspo"])
def test_two_steps_train_only_the_adapter(grpo_config, capture_trainer, assert_only_adapter_trained, stage):
    captured = capture_trainer(online)
    result = run_exp(grpo_config(stage=stage))
    assert result.global_step == 2
    assert_only_adapter_trained(Path(result.output_dir))

    trainer = captured["trainer"]
    # beta 0 (the default): no reference at all, neither a model nor a copied adapter.
    assert trainer.beta == 0.0 and trainer.ref_model is None and set(trainer.model.peft_config) == {"default"}
    # Sampling merged the adapter into the weights; it must be unmerged again for training and saving.
    assert not any(getattr(m, "merged", False) for m in trainer.model.modules())
    assert trainer.num_generations == 2 and trainer.max_completion_length == 8
    if stage == "gspo":  # the GSPO paper's defaults
        assert trainer.importance_sampling_level == "sequence" and trainer.loss_type == "grpo"
        assert (trainer.epsilon_low, trainer.epsilon_high) == (3e-4, 4e-4)
    else:  # TRL's defaults
        assert trainer.importance_sampling_level == "token" and trainer.loss_type == "dapo"
        assert (trainer.epsilon_low, trainer.epsilon_high) == (0.2, 0.2)

    rewards = [e["reward"] for e in read_log(result.output_dir) if "reward" in e]
    assert len(rewards) == 2 and all(math.isfinite(r) and r > 0 for r in rewards)  # every answer has characters


def test_options_reach_trl(grpo_config, capture_trainer):
    captured = capture_trainer(online)
    run_exp(grpo_config(max_steps=1, loss_type="bnpo", epsilon=0.1, epsilon_high=0.28, temperature=0.7, beta=0.04))
    trainer = captured["trainer"]
    assert trainer.loss_type == "bnpo" and (trainer.epsilon_low, trainer.epsilon_high) == (0.1, 0.28)
    assert trainer.temperature == 0.7 and trainer.beta == 0.04
    # beta > 0 needs a reference: under LoRA the base with the adapter disabled, no second model or adapter.
    assert trainer.ref_model is None and set(trainer.model.peft_config) == {"default"}


def _loss_with_offsets(trainer, offsets: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """The trainer's own loss for two fixed answers whose old log-probs are today's minus `offsets`."""
    model = trainer.model.eval()  # eval: no gradient-accumulation scaling of the loss
    prompt_ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    completion_ids = torch.tensor([[11, 12, 13], [14, 15, 16]])
    input_ids = torch.cat([prompt_ids, completion_ids], 1)
    with torch.no_grad():
        logps = trainer._get_per_token_logps_and_entropies(model, input_ids, torch.ones_like(input_ids), 3)[0]
    inputs = {"prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids), "completion_ids": completion_ids,
              "completion_mask": torch.ones_like(completion_ids), "advantages": advantages,
              "old_per_token_logps": logps - offsets, "num_items_in_batch": torch.tensor(6.0)}
    with torch.no_grad():
        return trainer._compute_loss(model, inputs)


def test_gspo_uses_one_length_normalised_ratio_per_answer(grpo_config, monkeypatch):
    built = {}
    monkeypatch.setattr(online, "train_and_save", lambda trainer, setup, args: built.setdefault("trainer", trainer))
    run_training(grpo_config(stage="gspo"))  # builds the trainer exactly as a run does, then stops
    trainer = built["trainer"]
    # Token log-ratios (new - old) of +0.2, -0.2, 0 average to 0: the sequence ratio is exactly 1, inside
    # GSPO's tiny clip range; the second answer's ratios average to 0.003, a ratio of e^0.003 > 1 + 4e-4.
    offsets = torch.tensor([[0.2, -0.2, 0.0], [0.003, 0.003, 0.003]])
    advantages = torch.tensor([1.0, 2.0])
    loss = _loss_with_offsets(trainer, offsets, advantages)
    # Per answer: -min(s*A, clip(s, 1-3e-4, 1+4e-4)*A); the second is clipped to 1 + 4e-4.
    expected = (-(1.0 * 1.0) - (1 + 4e-4) * 2.0) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-5)

    # The same trainer with token-level ratios (GRPO) gives a different loss on the same inputs: the
    # +0.2 token is clipped, the -0.2 token is not (pessimistic), so the first answer no longer scores -1.
    trainer.importance_sampling_level = "token"
    token_level = _loss_with_offsets(trainer, offsets, advantages)
    first = -((1 + 4e-4) + math.exp(-0.2) + 1.0) / 3
    assert token_level.item() == pytest.approx((first - (1 + 4e-4) * 2.0) / 2, abs=1e-5)
    assert abs(token_level.item() - loss.item()) > 1e-2


@pytest.mark.parametrize(("overrides", "match"), [
    ({"num_generations": 1}, "'num_generations' must be at least 2"),
    ({"num_generations": 3}, "must be a multiple of num_generations"),
    ({"reward_funcs": None}, "needs rewards"),
    ({"reward_funcs": ["acuracy"]}, "Did you mean 'accuracy'"),
])
def test_config_errors(grpo_config, overrides, match):
    with pytest.raises(ConfigError, match=match):
        run_exp(grpo_config(**overrides))
