"""Supervised fine-tuning (stage: sft): learn the assistant turns of conversations.

Reads alpaca, sharegpt or openai rows, renders them with the chat template (the tokenizer's own by
default) and computes the loss on assistant turns only (unless `train_on_prompt`; only the last one
with `mask_history`). Each answer ends with the end-of-turn token, so the model learns to stop.
Packing is off by default: rows are padded per batch, and with `packing: true` they are packed into
cutoff_len rows whose examples cannot attend to each other.
"""

from __future__ import annotations

from typing import Any

from gym.config.args import TrainArgs
from gym.core.kinds import DataKind
from gym.core.results import RunResult
from gym.train.workflow import run_causal_lm


def run(args: TrainArgs[Any]) -> RunResult:
    return run_causal_lm(args, data_kind=DataKind.SUPERVISED, packing_by_default=False)

