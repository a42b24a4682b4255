"""TDPO (Token-level Direct Preference Optimization, Zeng et al., ICML 2024): DPO with a token-level KL term.

DPO's implicit reward margin u = beta * (log pi/pi_ref(y_w) - log pi/pi_ref(y_l)) is corrected by the sequential
KL divergences D(y) = sum_t KL(pi_ref(.|x, y<t) || pi(.|x, y<t)) of the two answers, which DPO never looks at and
which let the rejected answer's distribution drift far from the reference:

    TDPO2 (the paper's recommended form, `pref_loss: tdpo`):
        loss = -log sigmoid(u - alpha * beta * (D(y_l) - stopgrad(D(y_w))))

At the start (policy == reference) u = 0 and both D = 0, so the loss is exactly ln 2, as for DPO.
The KL needs the whole next-token distribution of both models at every answer position, so this trainer asks for
full logits where TRL's DPO only needs the log-probability of the taken token.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.nn.functional as F


def tdpo_terms(logits: torch.Tensor, ref_logits: torch.Tensor, input_ids: torch.Tensor,
               completion_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sequence: log pi/pi_ref of the answer, and the sequential KL(pi_ref || pi) over its positions.

    logits, ref_logits: [B, T, V] for rows `input_ids` [B, T]; completion_mask [B, T] marks answer tokens.
    """
    targets = input_ids[:, 1:]
    mask = completion_mask[:, 1:].to(torch.float32)
    logp = logits[:, :-1].float().log_softmax(-1)
    ref_logp = ref_logits[:, :-1].float().log_softmax(-1)
    taken = logp.gather(-1, targets[..., None]).squeeze(-1)
    ref_taken = ref_logp.gather(-1, targets[..., None]).squeeze(-1)
    log_ratio = ((taken - ref_taken) * mask).sum(-1)
    kl = ((ref_logp.exp() * (ref_logp - logp)).sum(-1) * mask).sum(-1)
    return log_ratio, kl


def tdpo_loss(log_ratio: torch.Tensor, kl: torch.Tensor, beta: float, alpha: float) -> torch.Tensor:
    """TDPO2 per pair, from the terms of a batch laid out [chosen..., rejected...]."""
    chosen_ratio, rejected_ratio = log_ratio.chunk(2)
    chosen_kl, rejected_kl = kl.chunk(2)
    margin = beta * (chosen_ratio - rejected_ratio) - alpha * beta * (rejected_kl - chosen_kl.detach())
    return -F.logsigmoid(margin)


# The batch keys of TRL's DPO collator that are not model inputs.
_NOT_MODEL_INPUTS = ("completion_mask", "ref_chosen_logps", "ref_rejected_logps")


def tdpo_trainer_class(base: Any, alpha: float) -> Any:
    """`base` (Gym's DPOTrainer subclass) with TDPO's loss: same data, collator, reference handling and logs."""
    from trl.models.utils import disable_gradient_checkpointing
    from trl.trainer.utils import use_adapter

    class TDPOTrainer(base):
        tdpo_alpha = alpha

        def _compute_loss(self, model: Any, inputs: dict[str, torch.Tensor], return_outputs: bool) -> Any:
            mode = "train" if self.model.training else "eval"
            # Every model input of the batch: the ids, and a vision-language model's pixel_values (image_sizes, ...).
            forward: dict[str, Any] = {key: value for key, value in inputs.items() if key not in _NOT_MODEL_INPUTS}
            forward["use_cache"] = False
            logits = model(**forward).logits
            with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
                if self.ref_model is not None:
                    ref_logits = self.ref_model(**forward).logits
                else:  # under LoRA the reference is the base with the adapter disabled
                    unwrapped = self.accelerator.unwrap_model(self.model)
                    adapter = "ref" if "ref" in getattr(unwrapped, "peft_config", {}) else None
                    context = use_adapter(unwrapped, adapter_name=adapter) if hasattr(unwrapped, "peft_config") \
                        else contextlib.nullcontext()
                    with context:
                        ref_logits = self.model(**forward).logits
            log_ratio, kl = tdpo_terms(logits, ref_logits, inputs["input_ids"], inputs["completion_mask"])
            loss = tdpo_loss(log_ratio, kl, self.beta, self.tdpo_alpha).mean()
            chosen, rejected = (self.beta * log_ratio.detach()).chunk(2)
            chosen_kl, rejected_kl = kl.detach().chunk(2)
            for key, value in (("rewards/chosen", chosen.mean()), ("rewards/rejected", rejected.mean()),
                               ("rewards/accuracies", (chosen > rejected).float().mean()),
                               ("rewards/margins", (chosen - rejected).mean()),
                               ("kl/chosen", chosen_kl.mean()), ("kl/rejected", rejected_kl.mean())):
                self._metrics[mode][key].append(self.accelerator.gather(value).mean().item())
            return (loss, {"logits": logits}) if return_outputs else loss

    return TDPOTrainer
