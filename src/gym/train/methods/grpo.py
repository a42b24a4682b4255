"""GRPO (Shao et al., 2024) and GSPO (Zheng et al., 2025): online RL from rewards, no value model.

Reads `prompt` data (a conversation ending with a user turn, optionally an `answer` column that
verifiable rewards check). For each prompt the policy samples `num_generations` answers; each
answer's advantage is its reward minus the group's mean (divided by the group's std), and the policy
is updated with a clipped importance ratio, as in PPO. Rewards come from `reward_funcs`
(gym.train.reward_funcs) and/or a trained `reward_model`. Wraps TRL's GRPOTrainer.

`loss_type` sets how token losses are averaged: grpo (per sequence, the paper), dr_grpo, dapo
(TRL's default) or bnpo. `beta` > 0 adds a KL penalty to the reference model (under LoRA: the base
with the adapter disabled); TRL's default, followed here, is 0 (no reference model at all).

`stage: gspo` is GRPO with one importance ratio per sequence, the length-normalised (geometric mean)
token ratio, and the GSPO paper's clip range (3e-4, 4e-4) and per-sequence loss as defaults. TRL
1.16 has no "GSPO-token" variant, so none is offered.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from gym.config.args import TrainArgs
from gym.config.methods import Method, register
from gym.core.errors import ConfigError
from gym.core.kinds import DataKind
from gym.core.results import RunResult
from gym.train.generation import MergedLoraSampling
from gym.train.reward_funcs import RewardChoice, rewards_of
from gym.train.workflow import (
    Setup,
    choose_checkpointing,
    drop_fresh_reference_adapter,
    prepare,
    train_and_save,
    trl_args,
)


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
class GRPOOptions(RewardChoice, SamplingOptions):
    """Options of the grpo stage."""

    beta: float = field(default=0.0, metadata={"help": "KL penalty to the reference model (0: no reference)."})
    epsilon: float = field(default=0.2, metadata={"help": "Lower clip range of the importance ratio."})
    epsilon_high: float | None = field(
        default=None, metadata={"help": "Upper clip range (DAPO's clip-higher); default: epsilon."}
    )
    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo"] = field(
        default="dapo", metadata={"help": "How token losses are averaged: grpo, dr_grpo, dapo or bnpo."}
    )
    num_iterations: int = field(default=1, metadata={"help": "Policy updates per batch of samples (mu)."})
    importance_sampling_level: Literal["token", "sequence"] = field(
        default="token", metadata={"help": "token (GRPO) or sequence (GSPO) importance ratios."}
    )

    def validate(self, args: TrainArgs[Any]) -> None:
        RewardChoice.validate(self, args)
        SamplingOptions.validate(self, args)


@dataclass
class GSPOOptions(GRPOOptions):
    """Options of the gspo stage: GRPO's, with the GSPO paper's defaults."""

    epsilon: float = field(default=3e-4, metadata={"help": "Lower clip range of the sequence importance ratio."})
    epsilon_high: float | None = field(default=4e-4, metadata={"help": "Upper clip range of the sequence ratio."})
    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo"] = field(
        default="grpo", metadata={"help": "How token losses are averaged; GSPO averages per sequence (grpo)."}
    )
    importance_sampling_level: Literal["token", "sequence"] = field(
        default="sequence", metadata={"help": "sequence: one length-normalised ratio per answer (GSPO)."}
    )


def prompt_dataset(rows: list[dict[str, Any]] | None) -> Any:
    """Gym's prompt rows -> the text prompts (already in the chat format) and answer column TRL reads."""
    from datasets import Dataset

    if not rows:
        return None
    return Dataset.from_list([{k: v for k, v in row.items() if k != "prompt_ids"} for row in rows])


def sampling_values(options: SamplingOptions, setup: Setup) -> dict[str, Any]:
    return dict(
        num_generations=options.num_generations, max_completion_length=options.max_completion_length,
        temperature=options.temperature, top_p=options.top_p, log_completions=options.log_completions,
        # Stop at the chat format's end of turn, whatever the model's generation config says.
        generation_kwargs={"eos_token_id": setup.chat.stop_token_ids()},
    )


def run(args: TrainArgs[GRPOOptions]) -> RunResult:
    from trl import GRPOConfig, GRPOTrainer

    options = args.options
    funcs, weights = rewards_of(options)
    setup = prepare(args, DataKind.PROMPT)
    longest = max(len(r["prompt_ids"]) for r in setup.data.train) + options.max_completion_length
    choose_checkpointing(args, setup.model, longest * args.training.per_device_train_batch_size)
    config = trl_args(
        GRPOConfig, args, **sampling_values(options, setup), reward_weights=weights, beta=options.beta,
        epsilon=options.epsilon,
        epsilon_high=options.epsilon_high if options.epsilon_high is not None else options.epsilon,
        loss_type=options.loss_type, num_iterations=options.num_iterations,
        importance_sampling_level=options.importance_sampling_level,
    )

    class GymGRPOTrainer(MergedLoraSampling, GRPOTrainer):
        pass

    trainer = GymGRPOTrainer(model=setup.model, reward_funcs=funcs, args=config,
                             train_dataset=prompt_dataset(setup.data.train),
                             eval_dataset=prompt_dataset(setup.data.eval), processing_class=setup.tokenizer)
    drop_fresh_reference_adapter(setup.model, args)
    return train_and_save(trainer, setup, args)


register(Method(name="grpo", data_kind=DataKind.PROMPT, run=run, options=GRPOOptions,
                summary="group relative policy optimisation from reward functions"))
register(Method[GRPOOptions](name="gspo", data_kind=DataKind.PROMPT, run=run, options=GSPOOptions,
                summary="GRPO with sequence-level importance ratios"))
