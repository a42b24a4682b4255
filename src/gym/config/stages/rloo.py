"""The options of stage rloo (run by gym.train.methods.rloo)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gym.config.stages.online import OnlineOptions
from gym.config.stages.registry import Stage, register
from gym.core.kinds import DataKind


@dataclass
class RLOOOptions(OnlineOptions):
    """Options of the rloo stage."""

    beta: float = field(default=0.05, metadata={"help": "KL penalty to the reference model (0: no reference)."})
    epsilon: float = field(default=0.2, metadata={"help": "Clip range of the importance ratio."})
    num_iterations: int = field(default=1, metadata={"help": "Policy updates per batch of samples."})
    normalize_advantages: bool = field(default=False, metadata={"help": "Scale advantages to unit variance."})


register(Stage(name="rloo", data_kind=DataKind.PROMPT, trainer="gym.train.methods.rloo", options=RLOOOptions,
               summary="REINFORCE leave-one-out from reward functions"))
