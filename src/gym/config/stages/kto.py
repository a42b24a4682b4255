"""The options of stage kto (run by gym.train.methods.kto)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gym.config.stages.registry import Stage, register
from gym.core.errors import ConfigError
from gym.core.kinds import DataKind

if TYPE_CHECKING:
    from gym.config.args import TrainArgs


@dataclass
class KTOOptions:
    """Options of the kto stage."""

    pref_beta: float = field(default=0.1, metadata={"help": "Beta: how far the policy may move from the reference."})
    kto_chosen_weight: float = field(default=1.0, metadata={"help": "Loss weight of desirable answers."})
    kto_rejected_weight: float = field(default=1.0, metadata={"help": "Loss weight of undesirable answers."})
    pref_ftx: float = field(default=0.0, metadata={"help": "Not supported by kto (kept for LLaMA-Factory configs); "
                                                    "must stay 0."})

    def validate(self, args: TrainArgs[Any]) -> None:
        if self.pref_ftx:
            raise ConfigError("'pref_ftx' is not supported by kto; remove it.")
        if self.pref_beta <= 0:
            raise ConfigError(f"'pref_beta' must be positive, got {self.pref_beta}.")
        for key in ("kto_chosen_weight", "kto_rejected_weight"):
            if getattr(self, key) < 0:
                raise ConfigError(f"'{key}' must be >= 0, got {getattr(self, key)} (a negative weight trains away "
                                  "from what it weighs).")
        if self.kto_chosen_weight == self.kto_rejected_weight == 0:
            raise ConfigError("'kto_chosen_weight' and 'kto_rejected_weight' are both 0: the loss would be 0.")


register(Stage(name="kto", data_kind=DataKind.FEEDBACK, trainer="gym.train.methods.kto", options=KTOOptions,
               summary="Kahneman-Tversky optimisation on answers tagged good or bad", media=True))
