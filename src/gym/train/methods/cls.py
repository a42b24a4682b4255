"""Sequence classification (stage: cls): one class per text or conversation, e.g. a guard telling safe prompts
from unsafe ones.

Reads `labelled` data: each row is rendered by the chat format as it would be served (gym.data.processors.
classifier_text: a prompt up to the assistant header, or a whole conversation) and carries a class, by name or
by index into `labels`. The base model gets a new linear head (`score`, one output per class) read at the last
token, trained with cross-entropy through transformers' Trainer. The saved config.json holds the class names
(id2label, label2id), and the run's gym_config.yaml the `labels` it used, in order. Under LoRA the head trains in
full and is saved with the adapter (task type SEQ_CLS), as in rm; gym.models.classifier loads either kind of
output back. Accuracy is logged on the eval split (`val_size` or `eval_dataset`) as `eval_accuracy`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from gym.config.args import TrainArgs
from gym.config.stages.cls import ClassifierOptions
from gym.core.kinds import DataKind
from gym.core.results import RunResult
from gym.data.loader import TokenizedData
from gym.data.processors import class_index, class_names
from gym.models.loader import load_classifier_backbone
from gym.train.workflow import choose_checkpointing, prepare, train_and_save


def accuracy(prediction: Any) -> dict[str, float]:
    """The share of rows whose highest-scoring class is their own (the Trainer's compute_metrics)."""
    logits = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
    return {"accuracy": float(np.mean(np.argmax(logits, axis=-1) == prediction.label_ids))}


def run(args: TrainArgs[ClassifierOptions]) -> RunResult:
    from transformers import DataCollatorWithPadding, Trainer

    def classes(data: TokenizedData) -> list[str]:
        return class_names([*data.train, *(data.eval or [])], args.options.labels)

    setup = prepare(args, DataKind.LABELLED, model_loader=load_classifier_backbone,
                    loader_options=lambda data: {"labels": classes(data)})
    names = classes(setup.data)
    # The head reads each row's last token that is not padding: the model must pad with the tokenizer's id.
    setup.model.config.pad_token_id = setup.tokenizer.pad_token_id

    def encoded(rows: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        return [{"input_ids": r["input_ids"], "labels": class_index(r["label"], names)} for r in rows] if rows else None

    train = encoded(setup.data.train)
    assert train is not None  # get_dataset refuses an empty training set
    longest = max(len(r["input_ids"]) for r in train)
    choose_checkpointing(args, setup, longest * args.training.per_device_train_batch_size)
    # transformers' Trainer counts the tokens it reads (the rows' own, padding left out) only when asked: the
    # run's summary reports tokens/s from that count.
    setup.training.include_num_input_tokens_seen = "non_padding"
    trainer = Trainer(model=setup.model, args=setup.training, train_dataset=train,
                      eval_dataset=encoded(setup.data.eval), data_collator=DataCollatorWithPadding(setup.tokenizer),
                      processing_class=setup.tokenizer, compute_metrics=accuracy)
    # gym_config.yaml records the classes in index order, the data's own when `labels` was left unset.
    return train_and_save(trainer, setup, dataclasses.replace(args, options=dataclasses.replace(args.options,
                                                                                                labels=names)))
