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

Images (a vision-language model, rows with `images`): dpo and tdpo take them. The prompt's placeholders are expanded
by the model's processor when the rows are tokenized, the answers stay text, and each batch carries the prompt's
pixel_values (once per chosen and once per rejected sequence) into the policy's and the reference's forward
(gym.train.media_rows); `precompute_ref_log_probs` runs the reference over the same batches, pixels included. orpo,
simpo and cpo run on TRL's experimental trainers, which build the forward from the ids alone, and refuse rows with
media.
"""

from __future__ import annotations

from typing import Any

from gym.config.args import TrainArgs
from gym.config.stages.dpo import PreferenceOptions
from gym.core.kinds import DataKind
from gym.core.names import split_names
from gym.core.results import RunResult
from gym.models import vision
from gym.models.adapters import load_peft_adapter
from gym.models.loader import load_causal_lm, resolve_model_path
from gym.train.media_rows import media_collator, trl_rows
from gym.train.tdpo import tdpo_trainer_class
from gym.train.workflow import (
    Setup,
    choose_checkpointing,
    drop_fresh_reference_adapter,
    prepare,
    train_and_save,
    trl_args,
)


def run(args: TrainArgs[PreferenceOptions]) -> RunResult:
    options = args.options
    setup = prepare(args, DataKind.PAIRWISE, refuse_media=_media_refusal(args, options))
    longest = max(len(r["prompt_ids"]) + max(len(r["chosen_ids"]), len(r["rejected_ids"])) for r in setup.data.train)
    # Chosen and rejected go through the model in one batch of twice the size.
    choose_checkpointing(args, setup, 2 * longest * args.training.per_device_train_batch_size)
    if options.reference_free(args.finetuning.stage):
        trainer = _reference_free_trainer(args, options, setup)
    else:
        trainer = _dpo_trainer(args, options, setup)
    return train_and_save(trainer, setup, args)


def _media_refusal(args: TrainArgs[PreferenceOptions], options: PreferenceOptions) -> str | None:
    if not options.reference_free(args.finetuning.stage):
        return None
    return (f"pref_loss '{options.pref_loss}' cannot train on them: TRL's ORPO and CPO trainers build the model's "
            "forward from the token ids alone, so the model would never see the media. With media, use pref_loss "
            "sigmoid, ipo, hinge or tdpo.")


def _dataset(rows: list[dict[str, Any]] | None, media: bool = False) -> Any:
    from datasets import Dataset

    if not rows:
        return None
    return Dataset.from_list(trl_rows(rows) if media else rows)


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


def _reference_model(args: TrainArgs[PreferenceOptions], options: PreferenceOptions, setup: Setup) -> Any:
    if not options.ref_model:
        return None
    load = vision.load_multimodal if setup.media is not None else load_causal_lm
    ref = load(resolve_model_path(options.ref_model), args.model)
    for adapter in split_names(options.ref_model_adapters):
        ref = load_peft_adapter(ref, adapter).merge_and_unload()  # NaN or missing weights refused
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
    media: dict[str, Any] = {}
    if setup.media is not None:
        from trl.trainer.dpo_trainer import DataCollatorForPreference

        # TRL's text collator lays out each batch as every row's chosen sequence, then every rejected one: the
        # prompt's media twice. The media columns must reach the collator (remove_unused_columns would drop them).
        ids = DataCollatorForPreference(pad_token_id=setup.tokenizer.pad_token_id)
        media = {"data_collator": media_collator(ids, setup.media, repeats=2)}
    config = trl_args(
        DPOConfig, args, setup, beta=options.pref_beta, loss_type=losses, loss_weights=weights,
        label_smoothing=options.dpo_label_smoothing, precompute_ref_log_probs=options.precompute_ref_log_probs,
        max_length=None,  # rows are cut to cutoff_len when tokenized
        **({"remove_unused_columns": False} if media else {}),
    )
    model = setup.model
    trainer = trainer_class(
        model=model, ref_model=_reference_model(args, options, setup), args=config,
        train_dataset=_dataset(setup.data.train, bool(media)), eval_dataset=_dataset(setup.data.eval, bool(media)),
        processing_class=setup.processor or setup.tokenizer, **media,
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

    config = trl_args(Config, args, setup, beta=options.pref_beta, max_length=args.data.cutoff_len, **extra)
    train = _dataset([_to_trl_pairs(r) for r in setup.data.train])
    evaluation = _dataset([_to_trl_pairs(r) for r in setup.data.eval]) if setup.data.eval else None
    return GymPairTrainer(model=setup.model, args=config, train_dataset=train, eval_dataset=evaluation,
                          processing_class=setup.tokenizer)
