"""GRPO (Shao et al., 2024) and GSPO (Zheng et al., 2025): online RL from rewards, no value model.

Reads `prompt` data (a conversation ending with a user turn, optionally an `answer` column that
verifiable rewards check). For each prompt the policy samples `num_generations` answers; each
answer's advantage is its reward minus the group's mean (divided by the group's std), and the policy
is updated with a clipped importance ratio, as in PPO. Rewards come from `reward_funcs`
(gym.rewards.functions) and/or a trained `reward_model`. Wraps TRL's GRPOTrainer.

`loss_type` sets how token losses are averaged: grpo (per sequence, the paper), dr_grpo, dapo
(TRL's default) or bnpo. `beta` > 0 adds a KL penalty to the reference model (under LoRA: the base
with the adapter disabled); TRL's default, followed here, is 0 (no reference model at all).

`stage: gspo` is GRPO with one importance ratio per sequence, the length-normalised (geometric mean)
token ratio, and the GSPO paper's clip range (3e-4, 4e-4) and per-sequence loss as defaults. TRL
1.16 has no "GSPO-token" variant, so none is offered.
"""

from __future__ import annotations

from gym.config.args import TrainArgs
from gym.config.stages.grpo import GRPOOptions
from gym.core.results import RunResult
from gym.train.online import run_online


def run(args: TrainArgs[GRPOOptions]) -> RunResult:
    from trl import GRPOConfig, GRPOTrainer

    options = args.options
    epsilon_high = options.epsilon_high if options.epsilon_high is not None else options.epsilon
    return run_online(args, GRPOConfig, GRPOTrainer, beta=options.beta, epsilon=options.epsilon,
                      epsilon_high=epsilon_high, loss_type=options.loss_type, num_iterations=options.num_iterations,
                      importance_sampling_level=options.importance_sampling_level)
