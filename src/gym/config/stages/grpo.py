"""The options of stages grpo and gspo (run by gym.train.methods.grpo, whose docstring says what they optimise)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from gym.config.stages.online import OnlineOptions
from gym.config.stages.registry import Stage, register
from gym.core.kinds import DataKind


@dataclass
class GRPOOptions(OnlineOptions):
    """Options of the grpo stage."""

    beta: float = field(default=0.0, metadata={"help": "KL penalty to the reference model (0: no reference)."})
    epsilon: float = field(default=0.2, metadata={"help": "Lower clip range of the importance ratio."})
    epsilon_high: float | None = field(
        default=None, metadata={"help": "Upper clip range (DAPO's clip-higher); default: epsilon."}
    )
    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo"] = field(
        default="dapo", metadata={"help": "How token losses are averaged: grpo, dr_grpo, dapo or bnpo."}
    )
    num_iterations: int = field(default=1, metadata={"help": "Policy updates per batch of samples (mu)."})
    importance_sampling_level: Literal["token", "sequence"] = field(
        default="token", metadata={"help": "token (GRPO) or sequence (GSPO) importance ratios."}
    )


@dataclass
class GSPOOptions(GRPOOptions):
    """Options of the gspo stage: GRPO's, with the GSPO paper's defaults."""

    epsilon: float = field(default=3e-4, metadata={"help": "Lower clip range of the sequence importance ratio."})
    epsilon_high: float | None = field(default=4e-4, metadata={"help": "Upper clip range of the sequence ratio."})
    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo"] = field(
        default="grpo", metadata={"help": "How token losses are averaged; GSPO averages per sequence (grpo)."}
    )
    importance_sampling_level: Literal["token", "sequence"] = field(
        default="sequence", metadata={"help": "sequence: one length-normalised ratio per answer (GSPO)."}
    )


register(Stage(name="grpo", data_kind=DataKind.PROMPT, trainer="gym.train.methods.grpo", options=GRPOOptions,
               summary="group relative policy optimisation from reward functions"))
register(Stage[GRPOOptions](name="gspo", data_kind=DataKind.PROMPT, trainer="gym.train.methods.grpo",
                            options=GSPOOptions, summary="GRPO with sequence-level importance ratios"))
