"""KTO (Ethayarajh et al., 2024): learn from answers tagged desirable or undesirable, no pairs needed.

Reads `feedback` data: conversations whose last answer carries a `kto_tag` (true/false). Wraps TRL's
KTOTrainer. Its reference point (the KL term) is estimated from mismatched prompt/answer pairs made by
rotating answers within each batch, as in the paper. Under LoRA the reference model is the base with
the adapter disabled. `kto_chosen_weight` / `kto_rejected_weight` (LLaMA-Factory's names) weigh the
two kinds of example; with unbalanced data the paper advises
desirable_weight x n_desirable / (undesirable_weight x n_undesirable) in [1, 4/3].
"""

from __future__ import annotations

import logging
import random
from typing import Any

from gym.config.args import TrainArgs
from gym.config.stages.kto import KTOOptions
from gym.core.kinds import DataKind
from gym.core.results import RunResult
from gym.train.workflow import choose_checkpointing, drop_fresh_reference_adapter, prepare, train_and_save, trl_args

logger = logging.getLogger(__name__)


def run(args: TrainArgs[KTOOptions]) -> RunResult:
    from datasets import Dataset
    from trl import KTOConfig, KTOTrainer

    options = args.options
    setup = prepare(args, DataKind.FEEDBACK)
    rows = setup.data.train
    if len({row["label"] for row in rows}) < 2:
        logger.warning("KTO data has only %s answers; it learns best from both kinds.",
                       "desirable" if rows[0]["label"] else "undesirable")
    longest = max(len(r["prompt_ids"]) + len(r["completion_ids"]) for r in rows)
    # Each batch also runs the mismatched (KL) pairs.
    choose_checkpointing(args, setup, 2 * longest * args.training.per_device_train_batch_size)

    batch_size = args.training.per_device_train_batch_size

    class GymKTOTrainer(KTOTrainer):
        def _prepare_dataset(self, dataset: Any, *unused: Any, **also_unused: Any) -> Any:
            # Rows are already tokenized by Gym's chat format; only the mismatched pairs are added.
            if not self.calculate_KL:
                return dataset
            return dataset.map(_rotate_completions, batched=True, batch_size=batch_size)

    # The mismatched pairs are fixed per batch, so batches must come in dataset order: shuffle once here.
    rows = list(rows)
    random.Random(args.training.seed).shuffle(rows)
    config = trl_args(KTOConfig, args, setup, beta=options.pref_beta, desirable_weight=options.kto_chosen_weight,
                      undesirable_weight=options.kto_rejected_weight, max_length=None,
                      train_sampling_strategy="sequential")
    trainer = GymKTOTrainer(
        model=setup.model, args=config, train_dataset=Dataset.from_list(rows),
        eval_dataset=Dataset.from_list(setup.data.eval) if setup.data.eval else None,
        processing_class=setup.tokenizer,
    )
    drop_fresh_reference_adapter(setup.model, args)
    return train_and_save(trainer, setup, args)


def _rotate_completions(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """(x1, y1) ... (xn, yn) -> KL pairs (x1, yn), (x2, y1), ...: each prompt with another row's answer."""
    completions = batch["completion_ids"]
    batch["KL_completion_ids"] = completions[-1:] + completions[:-1]
    return batch
