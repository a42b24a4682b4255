"""RLOO (REINFORCE leave-one-out; Ahmadian et al., 2024): online RL from rewards with a baseline made
of the other samples of the same prompt.

Reads `prompt` data like grpo. For each prompt the policy samples `num_generations` answers; each
answer's advantage is its reward minus the mean reward of the *other* answers to that prompt, an
unbiased baseline that needs no value model. The reward includes a KL penalty to the reference model
(`beta`; under LoRA the base with the adapter disabled). Wraps TRL's RLOOTrainer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gym.config.args import TrainArgs
from gym.config.methods import Method, register
from gym.core.kinds import DataKind
from gym.core.results import RunResult
from gym.train.online import OnlineOptions, run_online


@dataclass
class RLOOOptions(OnlineOptions):
    """Options of the rloo stage."""

    beta: float = field(default=0.05, metadata={"help": "KL penalty to the reference model (0: no reference)."})
    epsilon: float = field(default=0.2, metadata={"help": "Clip range of the importance ratio."})
    num_iterations: int = field(default=1, metadata={"help": "Policy updates per batch of samples."})
    normalize_advantages: bool = field(default=False, metadata={"help": "Scale advantages to unit variance."})


def run(args: TrainArgs[RLOOOptions]) -> RunResult:
    from trl import RLOOConfig, RLOOTrainer

    options = args.options
    return run_online(args, RLOOConfig, RLOOTrainer, beta=options.beta, epsilon=options.epsilon,
                      num_iterations=options.num_iterations, normalize_advantages=options.normalize_advantages)


register(Method(name="rloo", data_kind=DataKind.PROMPT, run=run, options=RLOOOptions,
                summary="REINFORCE leave-one-out from reward functions"))
