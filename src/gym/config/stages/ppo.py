"""The options of stage ppo (run by Gym's own loop, gym.train.methods.ppo). Names and defaults follow LLaMA-Factory
where it has them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gym.config.rewards import RewardChoice
from gym.config.stages.registry import Stage, register
from gym.core.errors import ConfigError
from gym.core.kinds import DataKind

if TYPE_CHECKING:
    from gym.config.args import TrainArgs


@dataclass
class PPOOptions(RewardChoice):
    """Options of stage: ppo. Names and defaults follow LLaMA-Factory where it has them."""

    ppo_buffer_size: int = field(default=1, metadata={"help": "Batches of rollouts per optimisation phase."})
    ppo_epochs: int = field(default=4, metadata={"help": "Optimisation passes over each rollout."})
    ppo_score_norm: bool = field(default=False, metadata={"help": "Normalise scores by their running mean and std."})
    ppo_score_clip: float | None = field(default=None, metadata={"help": "Clip scores to [-x, x] (after norm)."})
    ppo_whiten_rewards: bool = field(default=False, metadata={"help": "Whiten per-token rewards (scale only)."})
    ppo_target: float | None = field(default=6.0, metadata={
        "help": "Target KL of the adaptive KL controller; null = a fixed coefficient."})
    ppo_horizon: int = field(default=10000, metadata={"help": "Horizon of the adaptive KL controller."})
    ppo_init_kl_coef: float = field(default=0.2, metadata={"help": "Initial KL penalty coefficient."})
    ppo_gamma: float = field(default=1.0, metadata={"help": "Discount factor for GAE."})
    ppo_lam: float = field(default=0.95, metadata={"help": "Lambda for GAE."})
    ppo_cliprange: float = field(default=0.2, metadata={"help": "Clip range of the policy probability ratio."})
    ppo_cliprange_value: float = field(default=0.2, metadata={"help": "Clip range of the value update."})
    ppo_vf_coef: float = field(default=0.1, metadata={"help": "Weight of the value loss."})
    max_completion_length: int = field(default=64, metadata={"help": "Most new tokens sampled per completion."})
    temperature: float = field(default=0.9, metadata={"help": "Sampling temperature for rollouts."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling threshold for rollouts."})

    def validate(self, args: TrainArgs[Any]) -> None:
        RewardChoice.validate(self, args)
        for name in ("ppo_buffer_size", "ppo_epochs", "ppo_horizon", "max_completion_length"):
            if getattr(self, name) < 1:
                raise ConfigError(f"'{name}' must be at least 1, got {getattr(self, name)}.")
        if self.temperature <= 0 or not 0 < self.top_p <= 1:
            raise ConfigError("'temperature' must be > 0 and 'top_p' in (0, 1].")
        if self.ppo_target is not None and self.ppo_target <= 0:
            raise ConfigError(f"'ppo_target' must be positive (null = a fixed KL coefficient), got {self.ppo_target}.")
        for key in ("neftune_noise_alpha", "use_liger_kernel"):
            if getattr(args.training, key):
                raise ConfigError(f"stage: ppo runs Gym's own loop, which does not apply '{key}'; remove it.")
        optim = str(args.training.optim)
        if args.finetuning.chosen() or optim not in ("adamw_torch", "adamw_torch_fused"):
            # Gym's PPO loop steps policy and value head with one AdamW of its own.
            raise ConfigError(f"stage: ppo trains with AdamW; "
                              f"'{(args.finetuning.chosen() or ['optim: ' + optim])[0]}' is not supported there.")
        nonzero_init = [k for k in ("pissa_init", "loftq_init") if getattr(args.finetuning, k)]
        if args.finetuning.finetuning_type == "lora" and nonzero_init:
            # PiSSA and LoftQ start the adapter non-zero (on a changed or rounded base), so the model with its
            # adapter disabled is not the starting model and cannot serve as the KL reference.
            raise ConfigError(f"stage: ppo does not support `{nonzero_init[0]}`: the KL reference is the model with "
                              "the adapter disabled, which then is not the starting model. Use plain LoRA.")


register(Stage(name="ppo", data_kind=DataKind.PROMPT, trainer="gym.train.methods.ppo", options=PPOOptions,
               summary="proximal policy optimisation with a value head (Gym's own loop)"))
