"""Preference optimisation on chosen/rejected pairs: DPO and its family (stage: dpo, tdpo, orpo, simpo, cpo).

`pref_loss` picks the objective, with LLaMA-Factory's spellings:
- sigmoid (DPO, Rafailov et al. 2023), ipo (Azar et al. 2023), hinge (SLiC): TRL's DPOTrainer, against
  a reference model. Under LoRA the reference is the base with the adapter disabled, never a second
  copy of the model; `precompute_ref_log_probs` computes the reference once, before training.
- tdpo (Zeng et al. 2024): DPO with the answers' token-level KL to the reference in the margin
  (gym.train.tdpo), on TRL's DPOTrainer (data, reference, logs) with its own loss. `stage: tdpo` = `pref_loss: tdpo`.
- orpo (Hong et al. 2024) and simpo (Meng et al. 2024): reference-free, TRL's experimental ORPO and
  CPO trainers (SimPO = CPO's simpo loss without its SFT term). `stage: orpo` / `stage: simpo` are the
  same as `stage: dpo` with that `pref_loss`; `stage: cpo` is CPO (Xu et al. 2024): the sigmoid loss
  on policy log-probs plus an SFT term on the chosen answer.

Where we depart from TRL: rows are tokenized by Gym's chat format (as in sft), not re-tokenized by
the trainer; `dpo_label_smoothing` is conservative DPO (cDPO), which TRL 1.16 no longer has for the
sigmoid loss, so it is rebuilt from TRL's own losses (see `_dpo_losses`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from peft import PeftModel

from gym.config.args import TrainArgs
from gym.config.methods import Method, register
from gym.core.errors import ConfigError
from gym.core.kinds import DataKind
from gym.core.names import split_names
from gym.core.results import RunResult
from gym.models.loader import load_causal_lm, resolve_model_path
from gym.train.tdpo import tdpo_trainer_class
from gym.train.workflow import (
    Setup,
    choose_checkpointing,
    drop_fresh_reference_adapter,
    prepare,
    train_and_save,
    trl_args,
)

REFERENCE_FREE = ("orpo", "simpo")
# Stages that are dpo with a fixed loss: `stage: orpo` is `stage: dpo` with `pref_loss: orpo`.
FORCED_LOSS = {"orpo": "orpo", "simpo": "simpo", "tdpo": "tdpo"}


@dataclass
class PreferenceOptions:
    """Options of the dpo, orpo, simpo and cpo stages."""

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

    def validate(self, args: TrainArgs[Any]) -> None:
        stage = args.finetuning.stage
        forced = FORCED_LOSS.get(stage)
        if forced is not None:
            if self.pref_loss not in ("sigmoid", forced):
                raise ConfigError(f"stage: {stage} uses pref_loss {forced}; remove pref_loss: {self.pref_loss} "
                                  "or use stage: dpo.")
            self.pref_loss = forced  # type: ignore[assignment]
        if not 0 <= self.dpo_label_smoothing < 0.5:
            raise ConfigError(f"'dpo_label_smoothing' must be in [0, 0.5), got {self.dpo_label_smoothing}.")
        if self.pref_beta <= 0:
            raise ConfigError(f"'pref_beta' must be positive, got {self.pref_beta}.")
        reference_free = stage == "cpo" or self.pref_loss in REFERENCE_FREE
        if reference_free and (self.ref_model or self.precompute_ref_log_probs):
            key = "ref_model" if self.ref_model else "precompute_ref_log_probs"
            raise ConfigError(f"'{key}' has no effect: {stage if stage == 'cpo' else self.pref_loss} needs no "
                              "reference model. Remove it.")
        if self.pref_loss == "tdpo" and (self.dpo_label_smoothing or self.pref_ftx or self.precompute_ref_log_probs):
            key = next(k for k in ("dpo_label_smoothing", "pref_ftx", "precompute_ref_log_probs") if getattr(self, k))
            raise ConfigError(f"'{key}' does not apply to tdpo: its KL term needs the reference's full "
                              "distribution at every step, and its loss has no smoothing or SFT term.")
        if self.pref_loss == "orpo" and stage != "cpo" and self.pref_ftx:
            raise ConfigError("'pref_ftx' does not apply to orpo: its loss already includes the SFT term.")


def run(args: TrainArgs[PreferenceOptions]) -> RunResult:
    options = args.options
    setup = prepare(args, DataKind.PAIRWISE)
    longest = max(len(r["prompt_ids"]) + max(len(r["chosen_ids"]), len(r["rejected_ids"])) for r in setup.data.train)
    # Chosen and rejected go through the model in one batch of twice the size.
    choose_checkpointing(args, setup.model, 2 * longest * args.training.per_device_train_batch_size)
    if args.finetuning.stage == "cpo" or options.pref_loss in REFERENCE_FREE:
        trainer = _reference_free_trainer(args, options, setup)
    else:
        trainer = _dpo_trainer(args, options, setup)
    return train_and_save(trainer, setup, args)


def _dataset(rows: list[dict[str, Any]] | None) -> Any:
    from datasets import Dataset

    return Dataset.from_list(rows) if rows else None


def _dpo_losses(options: PreferenceOptions) -> tuple[list[str], list[float]]:
    """pref_loss (+ label smoothing, + pref_ftx) -> TRL's loss_type and loss_weights lists."""
    eps = options.dpo_label_smoothing
    if options.pref_loss == "sigmoid" and eps > 0:
        # cDPO: (1-e)*-logsig(bz) + e*-logsig(-bz). TRL's "robust" loss is
        # [(1-e)*-logsig(bz) - e*-logsig(-bz)] / (1-2e), so 2(1-e)*sigmoid - (1-2e)*robust is exactly cDPO.
        losses, weights = ["sigmoid", "robust"], [2 * (1 - eps), -(1 - 2 * eps)]
    else:
        losses, weights = [options.pref_loss], [1.0]
    if options.pref_ftx > 0:
        losses.append("sft")
        weights.append(options.pref_ftx)
    return losses, weights


def _reference_model(args: TrainArgs[PreferenceOptions], options: PreferenceOptions) -> Any:
    if not options.ref_model:
        return None
    ref = load_causal_lm(resolve_model_path(options.ref_model), args.model)
    for adapter in split_names(options.ref_model_adapters):
        ref = PeftModel.from_pretrained(ref, adapter).merge_and_unload()
    return ref.eval().requires_grad_(False)


def _dpo_trainer(args: TrainArgs[PreferenceOptions], options: PreferenceOptions, setup: Setup) -> Any:
    from trl import DPOConfig, DPOTrainer

    class GymDPOTrainer(DPOTrainer):
        def _prepare_dataset(self, dataset: Any, *unused: Any, **also_unused: Any) -> Any:
            return dataset  # already tokenized by Gym's chat format

    trainer_class: Any
    if options.pref_loss == "tdpo":
        trainer_class = tdpo_trainer_class(GymDPOTrainer, options.tdpo_alpha)
        losses, weights = ["sigmoid"], [1.0]  # unused: the TDPO trainer computes its own loss
    else:
        trainer_class = GymDPOTrainer
        losses, weights = _dpo_losses(options)
    config = trl_args(
        DPOConfig, args, beta=options.pref_beta, loss_type=losses, loss_weights=weights,
        label_smoothing=options.dpo_label_smoothing, precompute_ref_log_probs=options.precompute_ref_log_probs,
        max_length=None,  # rows are cut to cutoff_len when tokenized
    )
    model = setup.model
    trainer = trainer_class(
        model=model, ref_model=_reference_model(args, options), args=config,
        train_dataset=_dataset(setup.data.train), eval_dataset=_dataset(setup.data.eval),
        processing_class=setup.tokenizer,
    )
    drop_fresh_reference_adapter(model, args)
    return trainer


def _to_trl_pairs(row: dict[str, list[int]]) -> dict[str, list[int]]:
    """Gym's pairwise row -> the column layout TRL's experimental ORPO/CPO trainers train on."""
    prompt = row["prompt_ids"]
    out = {"prompt_input_ids": prompt, "prompt_attention_mask": [1] * len(prompt)}
    for side in ("chosen", "rejected"):
        answer = row[f"{side}_ids"]
        out[f"{side}_input_ids"] = prompt + answer
        out[f"{side}_attention_mask"] = [1] * (len(prompt) + len(answer))
        out[f"{side}_labels"] = [-100] * len(prompt) + answer
    return out


def _reference_free_trainer(args: TrainArgs[PreferenceOptions], options: PreferenceOptions, setup: Setup) -> Any:
    if args.finetuning.stage == "cpo" or options.pref_loss == "simpo":
        from trl.experimental.cpo import CPOConfig as Config
        from trl.experimental.cpo import CPOTrainer as Base

        simpo = options.pref_loss == "simpo" and args.finetuning.stage != "cpo"
        extra = dict(loss_type="simpo" if simpo else "sigmoid", simpo_gamma=options.simpo_gamma,
                     cpo_alpha=options.pref_ftx if simpo else options.cpo_alpha,
                     label_smoothing=options.dpo_label_smoothing)
    else:
        from trl.experimental.orpo import ORPOConfig as Config
        from trl.experimental.orpo import ORPOTrainer as Base

        extra = {}

    class GymPairTrainer(Base):
        def tokenize_row(self, feature: dict[str, Any], model: Any = None) -> dict[str, Any]:
            return feature  # already tokenized by Gym's chat format

    config = trl_args(Config, args, beta=options.pref_beta, max_length=args.data.cutoff_len, **extra)
    train = _dataset([_to_trl_pairs(r) for r in setup.data.train])
    evaluation = _dataset([_to_trl_pairs(r) for r in setup.data.eval]) if setup.data.eval else None
    return GymPairTrainer(model=setup.model, args=config, train_dataset=train, eval_dataset=evaluation,
                          processing_class=setup.tokenizer)


def _register(name: str, summary: str) -> None:
    register(Method(name=name, data_kind=DataKind.PAIRWISE, run=run, options=PreferenceOptions, summary=summary))


_register("dpo", "direct preference optimisation on chosen/rejected pairs (pref_loss: sigmoid, ipo, hinge, ...)")
_register("tdpo", "token-level DPO: the answers' per-token KL to the reference in the margin")
_register("orpo", "odds-ratio preference optimisation, no reference model")
_register("simpo", "simple preference optimisation, no reference model")
_register("cpo", "contrastive preference optimisation, no reference model")
