"""The parsed config as one typed bundle: five concerns, plus the options of the chosen stage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from gym.config.data import DataArguments
from gym.config.finetuning import FinetuningArguments
from gym.config.generating import GeneratingArguments
from gym.config.model import ModelArguments
from gym.config.training import TrainingArguments

OptionsT = TypeVar("OptionsT")


@dataclass
class TrainArgs(Generic[OptionsT]):
    """What `get_train_args` returns: the five concerns, and `options`, the stage's own options (e.g. `pref_beta` for
    dpo), None for stages without any. (LLaMA-Factory's five-tuple is gym.hparams.get_train_args.)"""

    model: ModelArguments
    data: DataArguments
    training: TrainingArguments
    finetuning: FinetuningArguments
    generating: GeneratingArguments
    options: OptionsT

    @property
    def output_dir(self) -> str:
        """Where the run writes (the parser always sets it: the user's, or saves/<model>/<type>/<stage>)."""
        if self.training.output_dir is None:
            raise ValueError("TrainArgs built without an output_dir; build it with get_train_args")
        return self.training.output_dir
