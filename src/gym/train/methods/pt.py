"""Continued pre-training (stage: pt): next-token prediction on plain text.

Rows are text (alpaca formatting with `columns: {prompt: text}`, or any file with a `text` field).
Documents longer than cutoff_len are cut into chunks; chunks are packed by default, each isolated
from its neighbours by the attention mask (LLaMA-Factory's pt lets packed documents attend to each
other; we do not, so a document never conditions on an unrelated one).
"""

from __future__ import annotations

from typing import Any

from gym.config.args import TrainArgs
from gym.core.kinds import DataKind
from gym.core.results import RunResult
from gym.train.workflow import run_causal_lm


def run(args: TrainArgs[Any]) -> RunResult:
    return run_causal_lm(args, data_kind=DataKind.UNSUPERVISED, packing_by_default=True)

