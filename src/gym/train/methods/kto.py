"""KTO (Ethayarajh et al., 2024): learn from answers tagged desirable or undesirable, no pairs needed.

Reads `feedback` data: conversations whose last answer carries a `kto_tag` (true/false). Wraps TRL's
KTOTrainer. Its reference point (the KL term) is estimated from mismatched prompt/answer pairs: each
prompt with the answer of the row before it in training order, as LLaMA-Factory pairs them, so the pairs
do not depend on the batch size and `per_device_train_batch_size: 1` works (TRL pairs within each batch
and refuses batch size 1). Under LoRA the reference model is the base with the adapter disabled.
`kto_chosen_weight` / `kto_rejected_weight` (LLaMA-Factory's names) weigh the two kinds of example; with
unbalanced data the paper advises desirable_weight x n_desirable / (undesirable_weight x n_undesirable)
in [1, 4/3].

Images (a vision-language model, rows with `images`): the prompt's placeholders are expanded by the model's processor,
the tagged answer stays text, and each batch carries the prompts' pixel_values into the policy's, the reference's and
the KL pass's forward (a KL pair keeps its own prompt, so its own images; gym.train.media_rows).
"""

from __future__ import annotations

import logging
import random
from typing import Any

from gym.config.args import TrainArgs
from gym.config.stages.kto import KTOOptions
from gym.core.kinds import DataKind
from gym.core.results import RunResult
from gym.train.media_rows import media_collator, trl_rows
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
    if len(rows) < 2:
        logger.warning("KTO has one training row, so its KL pair is the row's own answer: the reference point "
                       "then equals that row's reward. Give it more rows.")
    longest = max(len(r["prompt_ids"]) + len(r["completion_ids"]) for r in rows)
    # Each batch also runs the mismatched (KL) pairs.
    choose_checkpointing(args, setup, 2 * longest * args.training.per_device_train_batch_size)

    batch_size = args.training.per_device_train_batch_size

    class GymKTOTrainer(KTOTrainer):
        def __init__(self, **kw: Any) -> None:
            # TRL refuses per_device_train_batch_size 1 because it pairs answers within a batch; our pairs
            # come ready-made (below), so it is shown 2 for that one check and given 1 back in
            # _prepare_dataset, which TRL calls next, before anything else (the base Trainer, its
            # dataloader, a DeepSpeed config) reads the batch size.
            self._restore_batch_size = batch_size < 2
            if self._restore_batch_size:
                kw["args"].per_device_train_batch_size = 2
            super().__init__(**kw)
            if self._restore_batch_size or self.args.per_device_train_batch_size != batch_size:
                raise RuntimeError("TRL's KTOTrainer no longer calls _prepare_dataset right after its batch-size "
                                   "check; Gym's batch-size-1 KTO needs a new way past it.")

        def _prepare_dataset(self, dataset: Any, processing_class: Any, trl_config: Any, *unused: Any) -> Any:
            if self._restore_batch_size:
                trl_config.per_device_train_batch_size = batch_size
                self._restore_batch_size = False
            # Rows are already tokenized by Gym's chat format, with their KL pairs.
            return dataset

    # The KL pairs are made over the training order and TRL requires sequential sampling when it estimates the
    # KL term, so the rows are shuffled once here and fed in this order.
    rows = list(rows)
    random.Random(args.training.seed).shuffle(rows)
    cutoff_len = args.data.cutoff_len

    def prepared(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        paired = with_kl_answers(rows, cutoff_len)
        return trl_rows(paired) if setup.media is not None else paired

    media: dict[str, Any] = {}
    if setup.media is not None:
        from trl.trainer.kto_trainer import DataCollatorForUnpairedPreference

        # The media columns must reach the collator (remove_unused_columns would drop them).
        ids = DataCollatorForUnpairedPreference(pad_token_id=setup.tokenizer.pad_token_id)
        media = {"data_collator": media_collator(ids, setup.media, repeats=1)}
    config = trl_args(KTOConfig, args, setup, beta=options.pref_beta, desirable_weight=options.kto_chosen_weight,
                      undesirable_weight=options.kto_rejected_weight, max_length=None,
                      train_sampling_strategy="sequential", **({"remove_unused_columns": False} if media else {}))
    trainer = GymKTOTrainer(
        model=setup.model, args=config, train_dataset=Dataset.from_list(prepared(rows)),
        eval_dataset=Dataset.from_list(prepared(setup.data.eval)) if setup.data.eval else None,
        processing_class=setup.processor or setup.tokenizer, **media,
    )
    drop_fresh_reference_adapter(setup.model, args)
    return train_and_save(trainer, setup, args)


def with_kl_answers(rows: list[dict[str, Any]], cutoff_len: int) -> list[dict[str, Any]]:
    """(x1, y1) ... (xn, yn) -> KL pairs (x1, yn), (x2, y1), ..., (xn, yn-1): each prompt with another row's answer.

    The pairs follow LLaMA-Factory's feedback processor (answers rotated by one over the dataset when it is
    preprocessed), not TRL's rotation within each batch of per_device_train_batch_size rows: the same
    estimator (the mean log-ratio of mismatched pairs), but it works at batch size 1, where TRL's rotation
    would pair a prompt with its own answer and make the reference point equal the reward. Fed in this
    order, a batch's KL answers are its own but for one, taken from the row just before the batch; and the
    pairs no longer change with the batch size. Each KL answer is cut, as the rows are, to fit cutoff_len
    after its prompt.
    """
    answers = [row["completion_ids"] for row in rows]
    return [{**row, "KL_completion_ids": answer[: cutoff_len - len(row["prompt_ids"])]}
            for row, answer in zip(rows, answers[-1:] + answers[:-1], strict=True)]
