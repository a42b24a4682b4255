"""The options of stage unlearn (run by gym.train.methods.unlearn, whose docstring gives each loss)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from gym.config.stages.registry import Stage, register
from gym.core.errors import ConfigError
from gym.core.kinds import DataKind

if TYPE_CHECKING:
    from gym.config.args import TrainArgs


@dataclass
class UnlearnOptions:
    """Options of stage unlearn."""

    unlearn_loss: Literal["ga", "npo", "simnpo"] = field(
        default="npo", metadata={"help": "Forget loss: ga (gradient ascent), npo or simnpo (reference-free NPO)."})
    unlearn_beta: float = field(default=0.1, metadata={"help": "NPO/SimNPO temperature beta."})
    simnpo_gamma: float = field(default=0.0, metadata={"help": "SimNPO reward margin gamma."})
    retain_dataset: str | None = field(
        default=None, metadata={"help": "Comma-separated datasets whose answers must be kept (supervised rows)."})
    retain_loss: Literal["nll", "kl"] = field(
        default="nll", metadata={"help": "On the retain set: nll (keep learning its answers) or kl (stay at the "
                                 "reference model's distribution)."})
    retain_weight: float = field(default=1.0, metadata={"help": "Weight of the retain loss."})

    def validate(self, args: TrainArgs[Any]) -> None:
        if self.unlearn_beta <= 0:
            raise ConfigError(f"'unlearn_beta' must be positive, got {self.unlearn_beta}.")
        if self.retain_weight < 0:
            raise ConfigError(f"'retain_weight' must be >= 0, got {self.retain_weight}.")
        if args.data.packing or args.data.neat_packing:
            raise ConfigError("stage: unlearn scores each forget answer as a whole; turn packing off.")


register(Stage(name="unlearn", data_kind=DataKind.SUPERVISED, trainer="gym.train.methods.unlearn",
               options=UnlearnOptions, summary="forget a dataset's answers (ga, npo, simnpo), keeping a retain set"))
