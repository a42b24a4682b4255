"""Gym's training methods. Importing this package registers each one (gym.config.methods.register);
the parser finds it through the `gym.methods` entry point, never by importing a method by name.

To add a method: write <name>.py here (options dataclass with validate(), run(), register(...)),
import it below, add tests/train/test_<name>.py and examples/<name>_lora.yaml.
"""

from gym.train.methods import dpo, grpo, kto, ppo, pt, rloo, rm, sft, unlearn

__all__ = ["dpo", "grpo", "kto", "ppo", "pt", "rloo", "rm", "sft", "unlearn"]
