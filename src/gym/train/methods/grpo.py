"""GRPO (Shao et al., 2024) and GSPO (Zheng et al., 2025): online RL from rewards, no value model.

Reads `prompt` data (a conversation ending with a user turn, optionally an `answer` column that
verifiable rewards check). For each prompt the policy samples `num_generations` answers; each
answer's advantage is its reward minus the group's mean (divided by the group's std), and the policy
is updated with a clipped importance ratio, as in PPO. Rewards come from `reward_funcs`
(gym.train.reward_funcs) and/or a trained `reward_model`. Wraps TRL's GRPOTrainer.

`loss_type` sets how token losses are averaged: grpo (per sequence, the paper), dr_grpo, dapo
(TRL's default) or bnpo. `beta` > 0 adds a KL penalty to the reference model (under LoRA: the base
with the adapter disabled); TRL's default, followed here, is 0 (no reference model at all).

`stage: gspo` is GRPO with one importance ratio per sequence, the length-normalised (geometric mean)
token ratio, and the GSPO paper's clip range (3e-4, 4e-4) and per-sequence loss as defaults. TRL
1.16 has no "GSPO-token" variant, so none is offered.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from gym.config.args import TrainArgs
from gym.config.methods import Method, register
from gym.core.kinds import DataKind
from gym.core.results import RunResult
from gym.train.online import OnlineOptions, run_online


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


def run(args: TrainArgs[GRPOOptions]) -> RunResult:
    from trl import GRPOConfig, GRPOTrainer

    options = args.options
    epsilon_high = options.epsilon_high if options.epsilon_high is not None else options.epsilon
    return run_online(args, GRPOConfig, GRPOTrainer, beta=options.beta, epsilon=options.epsilon,
                      epsilon_high=epsilon_high, loss_type=options.loss_type, num_iterations=options.num_iterations,
                      importance_sampling_level=options.importance_sampling_level)


register(Method(name="grpo", data_kind=DataKind.PROMPT, run=run, options=GRPOOptions,
                summary="group relative policy optimisation from reward functions"))
register(Method[GRPOOptions](name="gspo", data_kind=DataKind.PROMPT, run=run, options=GSPOOptions,
                summary="GRPO with sequence-level importance ratios"))
