"""`from zoo.gym import ...`, the seeds' spelling, is gym's own API (the same objects)."""

import gym


def test_zoo_gym_is_gym():
    from zoo.gym import BitDeltaConfig, ChatModel, PersonalizedTrainer

    assert PersonalizedTrainer is gym.PersonalizedTrainer
    assert BitDeltaConfig is gym.BitDeltaConfig and ChatModel is gym.ChatModel
