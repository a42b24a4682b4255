"""Gym's training stages, declared in the config layer: importing this package registers each one. The parser
finds it through the `gym.methods` entry point (pyproject.toml), as it finds a plugin's stages.

To add a stage: <name>.py here (its options dataclass with validate(), and register(Stage(...)) naming the training
module), gym/train/methods/<name>.py (its run(args)), tests/train/test_<name>.py and examples/<name>_lora.yaml.
"""

from gym.config.stages import cls, dpo, grpo, kto, ppo, pt, rloo, rm, sft, unlearn

__all__ = ["cls", "dpo", "grpo", "kto", "ppo", "pt", "rloo", "rm", "sft", "unlearn"]
