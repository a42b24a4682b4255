"""Seed 002, "Zoo Gym Training Methods": `from zoo.gym import ...` for Training-Free GRPO, BitDelta and
DeltaSoup, and the config objects its SDK examples build."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gym.core.errors import ConfigError


def test_zoo_gym_exports_every_name_the_seeds_import():
    import importlib

    import gym

    names = ("Trainer", "TrainingConfig", "TrainingFreeGRPO", "GRPOConfig", "PersonalizedTrainer", "BitDeltaConfig",
             "DeltaQuantConfig", "QuantMethod", "DeltaSoup", "DeltaSoupConfig", "AggregationMethod")
    zoo_gym = importlib.import_module("zoo.gym")
    exec("from zoo.gym import " + ", ".join(names), {})  # the seeds' own statement
    for name in names:
        assert getattr(zoo_gym, name) is getattr(gym, name), name


def test_training_free_grpo(tiny_model_dir):
    from zoo.gym import GRPOConfig, TrainingFreeGRPO

    # Configure Training-Free GRPO
    config = GRPOConfig(
        group_size=5,
        max_epochs=3,
        temperature_train=0.7
    )
    # Ours: short answers from the tiny local model (hub id swapped), 2 tasks.
    config = dataclasses.replace(config, max_tokens=6, update_max_tokens=16, batch_size=2)
    dataset = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(4)]

    def reward_fn(completion, answer):
        return float(answer in completion)

    trainer = TrainingFreeGRPO(str(tiny_model_dir), config)
    experiences = trainer.train(dataset[:2], reward_fn)
    assert len(trainer.history) == 3  # one step per epoch of one batch

    # Deploy instantly (no parameter updates)
    response = trainer.infer("What is 2 + 1?", experiences)
    assert isinstance(response, str)
    from safetensors.torch import load_file

    base = load_file(str(tiny_model_dir / "model.safetensors"))
    answering = trainer.model.chat_model.model.state_dict()  # the weights that answered: the base, bit for bit
    assert all(torch.equal(answering[name].to(value.dtype), value) for name, value in base.items())


def test_bitdelta_personalization(tiny_model_dir, assert_serves_variant):
    from zoo.gym import BitDeltaConfig, PersonalizedTrainer

    # Configure BitDelta
    config = BitDeltaConfig(
        bits=1,
        group_size=128,
        safety_threshold=0.6
    )
    config = dataclasses.replace(config, distill_steps=2)  # ours: 2 distillation steps, not 200
    user_data = [{"instruction": f"My favourite colour, {i}?", "output": "Teal, always teal."} for i in range(6)]

    # Train personalized variants (hub id -> the tiny local model)
    trainer = PersonalizedTrainer(str(tiny_model_dir), config)
    record = trainer.create_variant("user_123", user_data, max_steps=2)
    assert (record.method, record.training["stage"]) == ("bitdelta", "sft")  # rows with answers: sft
    assert 0 < record.bytes < record.base["parameters"] * 4 / 16  # 1 bit a weight plus scales, not a model copy

    # Serve variant
    response = trainer.serve_variant("user_123", "My favourite colour?", max_new_tokens=4)
    assert isinstance(response, str)
    chat = trainer.serve_variant("user_123")  # the model behind that answer: the base with the user's delta
    try:
        assert_serves_variant(chat)
    finally:
        chat.close()


def test_deltasoup_with_rewards(lora_finetune, lora_delta):
    from zoo.gym import AggregationMethod, DeltaSoup, DeltaSoupConfig

    # Configure DeltaSoup
    config = DeltaSoupConfig(
        method=AggregationMethod.BYZANTINE_ROBUST,
        differential_privacy=True,
        enable_rewards=True
    )
    # Ours: a fixed noise seed (for tests only: it voids the privacy), so the test can take the noise back out.
    config = dataclasses.replace(config, noise_seed=0)

    model_alice, model_bob, model_carol = (lora_finetune(seed, "v_proj") for seed in (1, 2, 3))

    # Users contribute improvements
    soup = DeltaSoup(config)
    soup.contribute(user_id="alice", model=model_alice)
    soup.contribute(user_id="bob", model=model_bob)

    # Aggregate community improvements: Byzantine-robust (Krum) needs three contributions, and says so.
    with pytest.raises(ConfigError, match="at least 3"):
        soup.aggregate()
    soup.contribute(user_id="carol", model=model_carol)
    aggregated_model = soup.aggregate()

    # The released delta is the robust mean of the clipped contributions plus Gaussian noise. The three agree,
    # so Krum keeps them all and each, clipped to clip_norm (1; each is longer), weighs a third; the noise is
    # N(0, sigma^2) per entry, drawn name by name in sorted order from noise_seed + the round number.
    deltas = [lora_delta(model) for model in (model_alice, model_bob, model_carol)]
    norms = [sum(float(v.square().sum()) for v in d.values()) ** 0.5 for d in deltas]
    assert min(norms) > config.clip_norm
    (spent,) = soup.status()["privacy"]["per_round"]
    assert (spent["epsilon"], spent["delta"], spent["sensitivity"]) == (1.0, 1e-5, 2 * config.clip_norm)
    sigma, generator = spent["sigma"], torch.Generator().manual_seed(config.noise_seed + spent["round"])
    assert sorted(aggregated_model) == [f"model.layers.{i}.self_attn.v_proj.weight" for i in range(2)]
    for name in sorted(aggregated_model):
        released = aggregated_model[name]
        noise = sigma * torch.randn(released.shape, generator=generator)
        mean = sum(d[name] / norm for d, norm in zip(deltas, norms)) / 3
        torch.testing.assert_close(released.double() - noise.double(), mean, rtol=0, atol=2e-5)
        assert (released - mean).std() == pytest.approx(sigma, rel=0.05)  # the noise is really there

    # Distribute rewards: the whole pool, to the three who agree (their shares: test_000_overview)
    rewards = soup.calculate_rewards()
    assert set(rewards) == {"alice", "bob", "carol"} and all(v > 0 for v in rewards.values())
    assert sum(rewards.values()) == pytest.approx(config.reward_pool)


def test_sdk_config_objects():
    from zoo.gym import BitDeltaConfig, DeltaSoupConfig, GRPOConfig

    assert GRPOConfig(group_size=5).group_size == 5
    assert BitDeltaConfig(bits=1).bits == 1
    assert DeltaSoupConfig(method="byzantine_robust").method.value == "byzantine_robust"
