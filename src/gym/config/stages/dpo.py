"""The options of the preference stages: dpo, tdpo, orpo, simpo and cpo (run by gym.train.methods.dpo, whose
docstring says what each loss optimises)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from gym.config.stages.registry import Stage, register
from gym.core.errors import ConfigError
from gym.core.kinds import DataKind

if TYPE_CHECKING:
    from gym.config.args import TrainArgs

REFERENCE_FREE = ("orpo", "simpo")


@dataclass
class PreferenceOptions:
    """Options of the dpo, tdpo, orpo, simpo and cpo stages."""

    pref_beta: float = field(default=0.1, metadata={"help": "Beta: the strength of the preference (or, for orpo, "
                                                     "the weight of the odds-ratio term)."})
    pref_loss: Literal["sigmoid", "ipo", "hinge", "tdpo", "orpo", "simpo"] = field(
        default="sigmoid", metadata={"help": "Preference loss: sigmoid (DPO), ipo, hinge, tdpo (token-level DPO), "
                                     "orpo or simpo."}
    )
    tdpo_alpha: float = field(
        default=0.5, metadata={"help": "TDPO: weight of the token-level KL term in the margin (the paper's alpha)."}
    )
    pref_ftx: float = field(default=0.0, metadata={"help": "Weight of an added SFT loss on the chosen answers."})
    simpo_gamma: float = field(default=0.5, metadata={"help": "SimPO target reward margin."})
    cpo_alpha: float = field(default=1.0, metadata={"help": "CPO: weight of the SFT term on the chosen answers."})
    dpo_label_smoothing: float = field(
        default=0.0, metadata={"help": "Conservative DPO: the share of preference labels assumed flipped, in [0, 0.5)."}
    )
    ref_model: str | None = field(
        default=None, metadata={"help": "Reference model (default: the model being trained, before training)."}
    )
    ref_model_adapters: str | None = field(default=None, metadata={"help": "Adapters applied to ref_model."})
    precompute_ref_log_probs: bool = field(
        default=False,
        metadata={"help": "Compute the reference log-probs once before training (no reference forward per step)."},
    )

    def reference_free(self, stage: str) -> bool:
        return stage == "cpo" or self.pref_loss in REFERENCE_FREE

    def validate(self, args: TrainArgs[Any]) -> None:
        stage = args.finetuning.stage
        if not 0 <= self.dpo_label_smoothing < 0.5:
            raise ConfigError(f"'dpo_label_smoothing' must be in [0, 0.5), got {self.dpo_label_smoothing}.")
        if self.pref_beta <= 0:
            raise ConfigError(f"'pref_beta' must be positive, got {self.pref_beta}.")
        if self.pref_ftx < 0:
            raise ConfigError(f"'pref_ftx' must be >= 0, got {self.pref_ftx} (a negative SFT weight unlearns the "
                              "chosen answers).")
        if self.simpo_gamma < 0:
            raise ConfigError(f"'simpo_gamma' (SimPO's target margin) must be >= 0, got {self.simpo_gamma}.")
        if self.reference_free(stage) and (self.ref_model or self.precompute_ref_log_probs):
            key = "ref_model" if self.ref_model else "precompute_ref_log_probs"
            raise ConfigError(f"'{key}' has no effect: {stage if stage == 'cpo' else self.pref_loss} needs no "
                              "reference model. Remove it.")
        if self.pref_loss == "tdpo" and (self.dpo_label_smoothing or self.pref_ftx or self.precompute_ref_log_probs):
            key = next(k for k in ("dpo_label_smoothing", "pref_ftx", "precompute_ref_log_probs") if getattr(self, k))
            raise ConfigError(f"'{key}' does not apply to tdpo: its KL term needs the reference's full "
                              "distribution at every step, and its loss has no smoothing or SFT term.")
        if self.pref_loss == "orpo" and stage != "cpo" and self.pref_ftx:
            raise ConfigError("'pref_ftx' does not apply to orpo: its loss already includes the SFT term.")


def _register(name: str, summary: str, pref_loss: str | None = None, media: bool = False) -> None:
    register(Stage(name=name, data_kind=DataKind.PAIRWISE, trainer="gym.train.methods.dpo", options=PreferenceOptions,
                   summary=summary, fixed={"pref_loss": pref_loss} if pref_loss else {}, media=media))


# DPO and TDPO run on TRL's DPOTrainer, which hands every batch tensor (pixel_values included) to the model; the
# reference-free ones run on TRL's experimental ORPO/CPO trainers, which build their forward from the ids alone.
_register("dpo", "direct preference optimisation on chosen/rejected pairs (pref_loss: sigmoid, ipo, hinge, ...)",
          media=True)
_register("tdpo", "token-level DPO: the answers' per-token KL to the reference in the margin", pref_loss="tdpo",
          media=True)
_register("orpo", "odds-ratio preference optimisation, no reference model", pref_loss="orpo")
_register("simpo", "simple preference optimisation, no reference model", pref_loss="simpo")
_register("cpo", "contrastive preference optimisation, no reference model")
