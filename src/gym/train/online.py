"""What the TRL-based online RL stages (grpo, gspo, rloo) share: how answers are sampled, where rewards
come from, and the run itself: prompts -> TRL's trainer (sampling with LoRA merged) -> the harness.
Each stage adds only its own loss options and the TRL classes to use."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gym.config.args import TrainArgs
from gym.core.errors import ConfigError
from gym.core.kinds import DataKind
from gym.core.results import RunResult
from gym.train.generation import MergedLoraSampling
from gym.train.reward_funcs import RewardChoice, rewards_of
from gym.train.workflow import choose_checkpointing, drop_fresh_reference_adapter, prepare, train_and_save, trl_args


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


def prompt_dataset(rows: list[dict[str, Any]] | None) -> Any:
    """Gym's prompt rows -> the text prompts (already in the chat format) and answer column TRL reads."""
    from datasets import Dataset

    if not rows:
        return None
    return Dataset.from_list([{k: v for k, v in row.items() if k != "prompt_ids"} for row in rows])


def run_online(args: TrainArgs[Any], config_cls: type, trainer_cls: type, **method_values: Any) -> RunResult:
    """One online stage end to end: `config_cls`/`trainer_cls` are TRL's (GRPOConfig/GRPOTrainer, ...), and
    `method_values` the stage's own config fields."""
    options: OnlineOptions = args.options
    funcs, weights = rewards_of(options)
    setup = prepare(args, DataKind.PROMPT)
    longest = max(len(r["prompt_ids"]) for r in setup.data.train) + options.max_completion_length
    choose_checkpointing(args, setup.model, longest * args.training.per_device_train_batch_size)
    config = trl_args(
        config_cls, args, num_generations=options.num_generations,
        max_completion_length=options.max_completion_length, temperature=options.temperature, top_p=options.top_p,
        log_completions=options.log_completions, reward_weights=weights,
        # Stop at the chat format's end of turn, whatever the model's generation config says.
        generation_kwargs={"eos_token_id": setup.chat.stop_token_ids()}, **method_values,
    )
    sampling_trainer = type(f"Gym{trainer_cls.__name__}", (MergedLoraSampling, trainer_cls), {})
    trainer = sampling_trainer(model=setup.model, reward_funcs=list(funcs), args=config,
                               train_dataset=prompt_dataset(setup.data.train),
                               eval_dataset=prompt_dataset(setup.data.eval), processing_class=setup.tokenizer)
    drop_fresh_reference_adapter(setup.model, args)
    return train_and_save(trainer, setup, args)
