"""Sampling during online training (grpo, gspo, rloo, ppo): LoRA merged into the weights while generating.

An unmerged LoRA model runs two extra small matmuls for every adapted linear layer at every decoded
token; on a CPU, where decoding is bound by the number of operations rather than by FLOPs, that is
about a third of the generation time. Merging before sampling and unmerging after costs two passes
over the adapted weights per rollout, and the policy samples from exactly the same distribution.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from peft import PeftModel, PeftType


def _lora_model(model: Any) -> Any | None:
    return model if isinstance(model, PeftModel) and model.peft_type == PeftType.LORA else None


@contextmanager
def merged_lora(model: Any) -> Iterator[None]:
    """Inside: the active LoRA adapter is folded into the base weights. Outside: as it was."""
    peft_model = _lora_model(model)
    if peft_model is None:
        yield
        return
    with torch.no_grad():
        peft_model.merge_adapter()
    try:
        yield
    finally:
        with torch.no_grad():
            peft_model.unmerge_adapter()


class MergedLoraSampling:
    """Mixin for TRL's online trainers: their single-turn generation runs with the adapter merged."""

    accelerator: Any  # the trainer's, set by TRL
    model: Any

    def _generate_single_turn(self, *args: Any, **kwargs: Any) -> Any:
        with merged_lora(self.accelerator.unwrap_model(self.model)):
            return super()._generate_single_turn(*args, **kwargs)  # type: ignore[misc]  # TRL's, after us in the MRO
