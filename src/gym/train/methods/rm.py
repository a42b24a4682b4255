"""Reward modelling (stage: rm): a scalar score that ranks the chosen answer above the rejected one.

Reads `pairwise` data. The base model gets a new linear head (`score`, one output) on the last token
and is trained with the Bradley-Terry loss -log sigmoid(r_chosen - r_rejected), through TRL's
RewardTrainer. Under LoRA the head trains in full and is saved with the adapter. Accuracy (how often
r_chosen > r_rejected) is logged while training and on the eval split (`val_size` or `eval_dataset`).
The output folder is what `reward_model:` (ppo) and `reward_funcs: [reward_model:<path>]` read.
"""

from __future__ import annotations

from gym.config.args import TrainArgs
from gym.config.stages.rm import RewardOptions
from gym.core.kinds import DataKind
from gym.core.results import RunResult
from gym.models.loader import load_reward_backbone
from gym.train.workflow import choose_checkpointing, prepare, train_and_save, trl_args


def run(args: TrainArgs[RewardOptions]) -> RunResult:
    from datasets import Dataset
    from trl import RewardConfig, RewardTrainer

    options = args.options
    setup = prepare(args, DataKind.PAIRWISE, model_loader=load_reward_backbone)

    def full_sequences(rows: list[dict[str, list[int]]] | None) -> Dataset | None:
        if not rows:
            return None
        return Dataset.from_list([{"chosen_ids": r["prompt_ids"] + r["chosen_ids"],
                                   "rejected_ids": r["prompt_ids"] + r["rejected_ids"]} for r in rows])

    train = full_sequences(setup.data.train)
    assert train is not None  # get_dataset refuses an empty training set
    longest = max(max(len(c), len(r)) for c, r in zip(train["chosen_ids"], train["rejected_ids"]))
    choose_checkpointing(args, setup, 2 * longest * args.training.per_device_train_batch_size)
    config = trl_args(RewardConfig, args, setup, max_length=None,
                      center_rewards_coefficient=options.center_rewards_coefficient)
    trainer = RewardTrainer(model=setup.model, args=config, train_dataset=train,
                            eval_dataset=full_sequences(setup.data.eval), processing_class=setup.tokenizer)
    return train_and_save(trainer, setup, args)
