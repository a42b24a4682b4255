"""RLOO (REINFORCE leave-one-out; Ahmadian et al., 2024): online RL from rewards with a baseline made
of the other samples of the same prompt.

Reads `prompt` data like grpo. For each prompt the policy samples `num_generations` answers; each
answer's advantage is its reward minus the mean reward of the *other* answers to that prompt, an
unbiased baseline that needs no value model. The reward includes a KL penalty to the reference model
(`beta`; under LoRA the base with the adapter disabled). Wraps TRL's RLOOTrainer.
"""

from __future__ import annotations

from gym.config.args import TrainArgs
from gym.config.stages.rloo import RLOOOptions
from gym.core.results import RunResult
from gym.train.online import run_online


def run(args: TrainArgs[RLOOOptions]) -> RunResult:
    from trl import RLOOConfig, RLOOTrainer

    options = args.options
    return run_online(args, RLOOConfig, RLOOTrainer, beta=options.beta, epsilon=options.epsilon,
                      num_iterations=options.num_iterations, normalize_advantages=options.normalize_advantages)
