"""Unlearning (stage: unlearn): make the model forget the answers of a forget set, while a retain set keeps the rest.

`dataset` is the forget set (supervised rows: the answers to forget); `retain_dataset`, optional, is what must
survive. The loss per step is forget_loss(forget batch) + retain_weight * retain_loss(retain batch):

- ga: gradient ascent, -NLL of the forget answers (Jang et al., 2023). Simple; unbounded, so it collapses fast.
- npo: negative preference optimisation (Zhang et al., 2024): (2/beta) * log(1 + (pi/pi_ref)^beta) per answer,
  DPO's loss with only a rejected answer; bounded, so it slows down as the answer becomes unlikely.
- simnpo (Fan et al., 2024): NPO without a reference, on the length-normalised log-likelihood, with a margin gamma:
  -(2/beta) * log sigmoid(-(beta/|y|) * log pi(y) - gamma).

Retain: nll (learn the retain answers as in sft) or kl (stay at the reference's next-token distribution on them).
Under LoRA the reference is the base with the adapter disabled; under full/freeze, a frozen copy of the start.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

from gym.config.args import TrainArgs
from gym.config.stages.unlearn import UnlearnOptions
from gym.core.kinds import DataKind
from gym.core.results import RunResult
from gym.data.collators import CausalLMCollator
from gym.data.loader import get_dataset
from gym.data.processors import IGNORE_INDEX
from gym.train.trainer import GymTrainer
from gym.train.workflow import choose_checkpointing, prepare, train_and_save


def answer_log_probs(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: the summed log-probability of its labelled tokens, and how many there are."""
    targets = labels[:, 1:]
    mask = targets != IGNORE_INDEX
    logp = logits[:, :-1].float().log_softmax(-1).gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1)
    return (logp * mask).sum(-1), mask.sum(-1)


def forget_loss(kind: str, logp: torch.Tensor, ref_logp: torch.Tensor | None, lengths: torch.Tensor, beta: float,
                gamma: float) -> torch.Tensor:
    """The mean forget loss of a batch, from per-answer log-likelihoods (see the module's docstring)."""
    if kind == "ga":
        return logp.sum() / lengths.sum().clamp(min=1)  # the NLL per token, negated
    if kind == "npo":
        assert ref_logp is not None
        return (-2 / beta * F.logsigmoid(-beta * (logp - ref_logp))).mean()
    return (-2 / beta * F.logsigmoid(-beta * logp / lengths.clamp(min=1) - gamma)).mean()


class UnlearnTrainer(GymTrainer):
    """GymTrainer whose batches are forget rows; each step also draws a retain batch, cycling through it."""

    def __init__(self, *args: Any, options: UnlearnOptions, retain: list[dict[str, Any]] | None,
                 reference: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.model_accepts_loss_kwargs = False  # per-batch means: the Trainer divides by accumulation steps
        self.options = options
        self.reference = reference  # None under LoRA: the adapter is disabled instead
        self._retain: Iterator[dict[str, torch.Tensor]] | None = None
        if retain:
            loader: torch.utils.data.DataLoader[Any] = torch.utils.data.DataLoader(
                retain, batch_size=self.args.per_device_train_batch_size,  # type: ignore[arg-type]
                shuffle=True, collate_fn=self.data_collator, generator=torch.Generator().manual_seed(self.args.seed))
            self._retain = itertools.cycle(loader)

    def _reference_logits(self, model: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.no_grad():
            if self.reference is not None:
                return self.reference(**inputs, use_cache=False).logits
            with self.accelerator.unwrap_model(model).disable_adapter():
                return model(**inputs, use_cache=False).logits

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: torch.Tensor | int | None = None) -> Any:
        options = self.options
        inputs = self.count_tokens(model, inputs)
        labels = inputs.pop("labels")
        logits = model(**inputs, use_cache=False).logits
        logp, lengths = answer_log_probs(logits, labels)
        ref_logp = None
        if options.unlearn_loss == "npo":
            ref_logp, _ = answer_log_probs(self._reference_logits(model, inputs), labels)
        loss = forget_loss(options.unlearn_loss, logp, ref_logp, lengths, options.unlearn_beta, options.simnpo_gamma)
        metrics = {"forget_nll": float(-logp.sum() / lengths.sum().clamp(min=1))}
        if self._retain is not None and model.training:
            retain = {k: v.to(logits.device) for k, v in next(self._retain).items() if k != "num_tokens"}
            retain_labels = retain.pop("labels")
            retain_logits = model(**retain, use_cache=False).logits
            if options.retain_loss == "nll":
                retain_logp, retain_lengths = answer_log_probs(retain_logits, retain_labels)
                retain_loss = -retain_logp.sum() / retain_lengths.sum().clamp(min=1)
            else:
                mask = (retain_labels[:, 1:] != IGNORE_INDEX).float()
                ref = self._reference_logits(model, retain)[:, :-1].float().log_softmax(-1)
                own = retain_logits[:, :-1].float().log_softmax(-1)
                retain_loss = ((ref.exp() * (ref - own)).sum(-1) * mask).sum() / mask.sum().clamp(min=1)
            loss = loss + options.retain_weight * retain_loss
            metrics["retain_loss"] = float(retain_loss)
        if model.training:
            self._last_metrics = metrics
        return (loss, {"logits": logits}) if return_outputs else loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs:
            logs.update(getattr(self, "_last_metrics", {}))
        super().log(logs, start_time)


def run(args: TrainArgs[UnlearnOptions]) -> RunResult:
    options = args.options
    setup = prepare(args, DataKind.SUPERVISED)
    retain = None
    if options.retain_dataset:
        retain_args = dataclasses.replace(args.data, dataset=options.retain_dataset, eval_dataset=None, val_size=0)
        retain = get_dataset(retain_args, setup.chat, DataKind.SUPERVISED, seed=args.training.seed).train
    longest = max(len(row["input_ids"]) for row in setup.data.train)
    choose_checkpointing(args, setup, 2 * longest * args.training.per_device_train_batch_size)
    needs_reference = options.unlearn_loss == "npo" or (retain is not None and options.retain_loss == "kl")
    is_adapter = hasattr(setup.model, "disable_adapter")
    reference = None
    if needs_reference and not is_adapter:
        reference = copy.deepcopy(setup.model).eval().requires_grad_(False)
    trainer = UnlearnTrainer(
        model=setup.model, args=setup.training, train_dataset=setup.data.train, eval_dataset=setup.data.eval,
        data_collator=CausalLMCollator(pad_token_id=setup.tokenizer.pad_token_id),
        processing_class=setup.tokenizer, options=options, retain=retain, reference=reference,
    )
    return train_and_save(trainer, setup, args)
