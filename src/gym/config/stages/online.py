"""What the online RL stages (grpo, gspo, rloo) share in their options: how answers are sampled, and where rewards
come from (gym.config.rewards)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gym.config.rewards import RewardChoice
from gym.core.errors import ConfigError

if TYPE_CHECKING:
    from gym.config.args import TrainArgs


@dataclass
class SamplingOptions:
    """How answers are sampled during online training."""

    num_generations: int = field(default=4, metadata={"help": "Answers sampled per prompt (the group size)."})
    max_completion_length: int = field(default=256, metadata={"help": "Most tokens per sampled answer."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature for the answers."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling mass for the answers."})
    log_completions: bool = field(default=False, metadata={"help": "Print sampled answers and rewards when logging."})

    def validate(self, args: TrainArgs[Any]) -> None:
        if self.num_generations < 2:
            raise ConfigError(f"'num_generations' must be at least 2 (advantages compare answers within a group), "
                              f"got {self.num_generations}.")
        batch = args.training.per_device_train_batch_size * args.training.gradient_accumulation_steps
        if batch % self.num_generations:
            raise ConfigError(f"per_device_train_batch_size x gradient_accumulation_steps ({batch}) counts answers "
                              f"and must be a multiple of num_generations ({self.num_generations}).")
        if self.max_completion_length < 1 or self.temperature <= 0 or not 0 < self.top_p <= 1:
            raise ConfigError("Sampling needs max_completion_length >= 1, temperature > 0 and top_p in (0, 1].")


@dataclass
class OnlineOptions(RewardChoice, SamplingOptions):
    """Rewards and sampling: the options every online stage starts from."""

    def validate(self, args: TrainArgs[Any]) -> None:
        RewardChoice.validate(self, args)
        SamplingOptions.validate(self, args)
