"""`GymTrainer`: the Hugging Face Trainer with a causal-LM loss that only projects supervised tokens.

The stock loss materialises float32 logits for every position (batch x length x vocab); prompts and
padding are then thrown away. Here the LM head runs only on positions that have a label, which on
chat data skips most of the vocabulary projection. Everything else (optimisers, schedulers,
checkpoints, resume, logging) is the stock Trainer.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F
from peft.optimizers import create_loraplus_optimizer
from transformers import Trainer

from gym.data.processors import IGNORE_INDEX
from gym.models.logit_positions import no_positions


def supervised_lm_loss(model: Any, inputs: dict[str, torch.Tensor], labels: torch.Tensor,
                       num_items_in_batch: torch.Tensor | int | None = None, dft: bool = False,
                       fused: bool = False) -> torch.Tensor:
    """Next-token cross-entropy over labelled positions, computed from the final hidden states. `dft`: each
    token's loss weighted by its probability, held constant (Dynamic Fine-Tuning, Wu et al., 2025). `fused`
    (use_liger_kernel, on a CUDA GPU): the head and the loss in Liger's fused kernel."""
    # The model projects no position itself: the head runs below, on the labelled positions only.
    outputs = model(**inputs, output_hidden_states=True, use_cache=False,
                    logits_to_keep=no_positions(labels.device))
    hidden = outputs.hidden_states[-1][:, :-1]
    targets = labels[:, 1:]
    selected = targets != IGNORE_INDEX
    # Under DDP the model is wrapped; the head is the wrapped model's own (its gradients still reach DDP's hooks).
    core = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    head = core.get_output_embeddings()
    # The head runs outside the model's autocast: in its own weights' dtype (a bf16 base's head in bf16, a head
    # trained in full as a float32 copy in float32), whatever dtype a trained final norm hands it.
    hidden = hidden.to(head.weight.dtype)
    if fused and not dft and type(head) is torch.nn.Linear and hidden.is_cuda:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

        # Chunk by chunk, projecting and writing the gradients in the forward pass: the float32 logits over the
        # whole vocabulary never exist at once. Without this, Liger's patched modules ran under our own loss and
        # cost speed and saved little memory (a 152k vocabulary at 8 x 1,024 tokens: 25 GB peak, TRL 4 GB).
        loss = liger_fused_linear_cross_entropy(hidden[selected], head.weight, targets[selected], bias=head.bias,
                                                reduction="sum")
    else:
        token_loss = F.cross_entropy(head(hidden[selected]).float(), targets[selected], reduction="none")
        if dft:
            token_loss = token_loss * torch.exp(-token_loss).detach()
        loss = token_loss.sum()
    denominator = num_items_in_batch if num_items_in_batch is not None else selected.sum().clamp(min=1)
    return loss / denominator


class GymTrainer(Trainer):
    # Our loss is normalised by the token count of the whole accumulated batch, which the Trainer
    # only computes when it believes the model takes loss kwargs.
    loss_is_scaled_for_ga = True

    def __init__(self, *args: Any, loraplus_lr_ratio: float | None = None, loraplus_lr_embedding: float = 1e-6,
                 dft_loss: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.dft_loss = dft_loss
        self.model_accepts_loss_kwargs = True
        self.loraplus_lr_ratio = loraplus_lr_ratio
        self.loraplus_lr_embedding = loraplus_lr_embedding
        self.tokens_seen = 0
        self.train_started: float | None = None  # set at the first training batch, so setup is not counted

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: torch.Tensor | int | None = None) -> Any:
        inputs = self.count_tokens(model, inputs)
        labels = inputs.pop("labels")
        loss = supervised_lm_loss(model, inputs, labels, num_items_in_batch if model.training else None,
                                  dft=self.dft_loss, fused=bool(self.args.use_liger_kernel))
        if model.training and num_items_in_batch is not None and self.args.average_tokens_across_devices:
            # The token count is the whole global batch's and DDP averages the ranks' gradients: scale back up,
            # as the stock Trainer does, so N processes step exactly as one process on the same global batch.
            loss = loss * self.accelerator.num_processes
        return (loss, {"loss": loss}) if return_outputs else loss

    def count_tokens(self, model: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        """The batch without its `num_tokens`, which is added to the count of trained tokens."""
        inputs = dict(inputs)
        num_tokens = inputs.pop("num_tokens", None)
        if model.training and num_tokens is not None:
            if self.train_started is None:
                self.train_started = time.perf_counter()
            self.tokens_seen += int(num_tokens)
        return inputs

    def create_optimizer(self, model: Any = None) -> Any:
        if self.optimizer is None and self.loraplus_lr_ratio is not None:
            peft_model: Any = self.model  # a PeftModel: LoRA+ is only offered with finetuning_type lora
            optimizer_cls, optimizer_kwargs = self.get_optimizer_cls_and_kwargs(self.args, peft_model)
            optimizer_kwargs.pop("lr", None)
            self.optimizer = create_loraplus_optimizer(
                model=peft_model, optimizer_cls=optimizer_cls, lr=self.args.learning_rate,
                loraplus_lr_ratio=self.loraplus_lr_ratio, loraplus_lr_embedding=self.loraplus_lr_embedding,
                **optimizer_kwargs,
            )
            return self.optimizer
        return super().create_optimizer(model) if model is not None else super().create_optimizer()

    def tokens_per_second(self) -> float:
        if self.train_started is None:
            return 0.0
        return self.tokens_seen / max(time.perf_counter() - self.train_started, 1e-9)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self.train_started is not None:
            logs["tokens_per_second"] = round(self.tokens_per_second(), 2)
        super().log(logs, start_time)
