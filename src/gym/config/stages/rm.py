"""The options of stage rm (run by gym.train.methods.rm)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gym.config.stages.registry import Stage, register
from gym.core.kinds import DataKind


@dataclass
class RewardOptions:
    """Options of the rm stage."""

    center_rewards_coefficient: float | None = field(
        default=None,
        metadata={"help": "Weight of a penalty on (r_chosen + r_rejected)^2 that keeps rewards centred on zero."},
    )


register(Stage(name="rm", data_kind=DataKind.PAIRWISE, trainer="gym.train.methods.rm", options=RewardOptions,
               summary="reward model: a scalar score trained on chosen/rejected pairs"))
