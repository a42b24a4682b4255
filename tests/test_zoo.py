"""`from zoo.gym import ...`, the seeds' spelling, is gym's own API (the same objects)."""

import gym


def test_zoo_gym_is_gym():
    from zoo.gym import BitDeltaConfig, ChatModel, PersonalizedTrainer

    assert PersonalizedTrainer is gym.PersonalizedTrainer
    assert BitDeltaConfig is gym.BitDeltaConfig and ChatModel is gym.ChatModel


def test_zoo_gym_has_training_free_grpo():
    import gym.tfgrpo
    from zoo.gym import GRPOConfig, TrainingFreeGRPO

    assert TrainingFreeGRPO is gym.tfgrpo.TrainingFreeGRPO and GRPOConfig is gym.tfgrpo.GRPOConfig
    assert GRPOConfig(group_size=5, max_epochs=3, temperature_train=0.7).group_size == 5
