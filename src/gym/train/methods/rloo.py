"""RLOO (REINFORCE leave-one-out; Ahmadian et al., 2024): online RL from rewards with a baseline made
of the other samples of the same prompt.

Reads `prompt` data like grpo. For each prompt the policy samples `num_generations` answers; each
answer's advantage is its reward minus the mean reward of the *other* answers to that prompt, an
unbiased baseline that needs no value model. The reward includes a KL penalty to the reference model
(`beta`; under LoRA the base with the adapter disabled). Wraps TRL's RLOOTrainer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gym.config.args import TrainArgs
from gym.config.methods import Method, register
from gym.core.kinds import DataKind
from gym.core.results import RunResult
from gym.train.generation import MergedLoraSampling
from gym.train.methods.grpo import SamplingOptions, prompt_dataset, sampling_values
from gym.train.reward_funcs import RewardChoice, rewards_of
from gym.train.workflow import choose_checkpointing, drop_fresh_reference_adapter, prepare, train_and_save, trl_args


@dataclass
class RLOOOptions(RewardChoice, SamplingOptions):
    """Options of the rloo stage."""

    beta: float = field(default=0.05, metadata={"help": "KL penalty to the reference model (0: no reference)."})
    epsilon: float = field(default=0.2, metadata={"help": "Clip range of the importance ratio."})
    num_iterations: int = field(default=1, metadata={"help": "Policy updates per batch of samples."})
    normalize_advantages: bool = field(default=False, metadata={"help": "Scale advantages to unit variance."})

    def validate(self, args: TrainArgs[Any]) -> None:
        RewardChoice.validate(self, args)
        SamplingOptions.validate(self, args)


def run(args: TrainArgs[RLOOOptions]) -> RunResult:
    from trl import RLOOConfig, RLOOTrainer

    options = args.options
    funcs, weights = rewards_of(options)
    setup = prepare(args, DataKind.PROMPT)
    longest = max(len(r["prompt_ids"]) for r in setup.data.train) + options.max_completion_length
    choose_checkpointing(args, setup.model, longest * args.training.per_device_train_batch_size)
    config = trl_args(RLOOConfig, args, **sampling_values(options, setup), reward_weights=weights, beta=options.beta,
                      epsilon=options.epsilon, num_iterations=options.num_iterations,
                      normalize_advantages=options.normalize_advantages)

    class GymRLOOTrainer(MergedLoraSampling, RLOOTrainer):
        pass

    trainer = GymRLOOTrainer(model=setup.model, reward_funcs=funcs, args=config,
                             train_dataset=prompt_dataset(setup.data.train),
                             eval_dataset=prompt_dataset(setup.data.eval), processing_class=setup.tokenizer)
    drop_fresh_reference_adapter(setup.model, args)
    return train_and_save(trainer, setup, args)


register(Method(name="rloo", data_kind=DataKind.PROMPT, run=run, options=RLOOOptions,
                summary="REINFORCE leave-one-out from reward functions"))
