"""The run the TRL-based online RL stages (grpo, gspo, rloo) share: prompts -> TRL's trainer (sampling with LoRA
merged) -> the harness. Each stage adds only its own loss options (gym.config.stages) and the TRL classes to use."""

from __future__ import annotations

from typing import Any

from gym.config.args import TrainArgs
from gym.config.stages.online import OnlineOptions
from gym.core.kinds import DataKind
from gym.core.results import RunResult
from gym.rewards.functions import rewards_of
from gym.train.generation import MergedLoraSampling
from gym.train.workflow import choose_checkpointing, drop_fresh_reference_adapter, prepare, train_and_save, trl_args


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
    choose_checkpointing(args, setup, longest * args.training.per_device_train_batch_size)
    config = trl_args(
        config_cls, args, setup, num_generations=options.num_generations,
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
