"""Training-Free GRPO: learn an experience library in context (gym.tfgrpo.trainer says how).

    from gym.tfgrpo import TrainingFreeGRPO, GRPOConfig
    trainer = TrainingFreeGRPO("smollm2-135m", GRPOConfig(group_size=5, max_epochs=3, temperature_train=0.7))
    experiences = trainer.train("arithmetic_demo", "accuracy")
    print(trainer.infer("What is 17 * 3?", experiences))
"""

from __future__ import annotations

from gym.tfgrpo.config import GRPOConfig
from gym.tfgrpo.library import ExperienceLibrary, Operation, with_experiences
from gym.tfgrpo.llm import LLM, Completion, LocalLLM, OpenAIEndpoint
from gym.tfgrpo.trainer import EvalResult, TrainingFreeGRPO

__all__ = ["LLM", "Completion", "EvalResult", "ExperienceLibrary", "GRPOConfig", "LocalLLM", "OpenAIEndpoint",
           "Operation", "TrainingFreeGRPO", "with_experiences"]
