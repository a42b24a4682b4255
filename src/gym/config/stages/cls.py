"""The options of stage cls (run by gym.train.methods.cls)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gym.config.stages.registry import Stage, register
from gym.core.errors import ConfigError
from gym.core.kinds import DataKind

if TYPE_CHECKING:
    from gym.config.args import TrainArgs


@dataclass
class ClassifierOptions:
    """Options of stage cls: one class per row (single-label classification)."""

    labels: list[str] | None = field(
        default=None,
        metadata={"help": "The class names, in index order (rows may give a name or an index). Default: the "
                  "distinct names in the data, sorted; for integer labels, 0 up to the largest."},
    )

    def validate(self, args: TrainArgs[Any]) -> None:
        if self.labels is not None:
            if len(self.labels) < 2:
                raise ConfigError(f"'labels' lists the classes, and a classifier needs at least two; got "
                                  f"{self.labels}. List every class, e.g. labels: [safe, unsafe], or leave it unset "
                                  "to take the classes found in the data.")
            if any(not name.strip() for name in self.labels):
                raise ConfigError(f"'labels' has an empty class name: {self.labels}.")
            repeated = sorted({name for name in self.labels if self.labels.count(name) > 1})
            if repeated:
                raise ConfigError(f"'labels' names the class {repeated[0]!r} twice; each class once, in index order.")
        if args.data.packing or args.data.neat_packing:
            raise ConfigError("stage: cls classifies each row as a whole; turn packing off.")
        if args.finetuning.delta_compression:
            raise ConfigError("delta_compression applies to language models; a classifier (stage: cls) is not one.")
        if args.finetuning.eval_tasks:
            raise ConfigError("'eval_tasks' evaluate a language model's answers; a classifier (stage: cls) reports "
                              "eval_accuracy on val_size or eval_dataset instead. Remove eval_tasks.")


register(Stage(name="cls", data_kind=DataKind.LABELLED, trainer="gym.train.methods.cls", options=ClassifierOptions,
               summary="sequence classifier: a class per text or conversation (e.g. a safe/unsafe guard)"))
