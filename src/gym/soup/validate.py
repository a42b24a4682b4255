"""The validation-loss check: does this contribution, applied alone to the base, keep the model useful?

Rule (documented in docs/soup.md): with L0 the base's mean token loss on the validation rows and L the loss
of base + contribution, a contribution is rejected when L > L0 * (1 + quality_threshold) (or L is not
finite). It catches deltas that break the model outright (noise, sign flips of large updates); subtler
attacks are left to the robust aggregators, which compare contributions with each other.
"""

from __future__ import annotations

import math
from functools import cached_property
from typing import Any

import torch

from gym.delta.evaluate import eval_loss, eval_rows
from gym.delta.safety import added
from gym.models.loader import load_tokenizer, resolve_model_path
from gym.soup.config import DeltaSoupConfig
from gym.soup.contributions import Base


class Validator:
    """Loads the validation rows and the base loss once, then evaluates one delta at a time in place."""

    def __init__(self, base: Base, config: DeltaSoupConfig) -> None:
        self.base = base
        self.config = config

    @cached_property
    def rows(self) -> list[dict[str, list[int]]]:
        config = self.config
        return eval_rows(load_tokenizer(resolve_model_path(self.base.ref)), str(config.validation_dataset),
                         config.validation_dataset_dir, config.validation_cutoff_len, config.validation_max_samples)

    @cached_property
    def base_loss(self) -> float:
        return eval_loss(self.base.model, self.rows)

    def loss_with(self, delta: dict[str, torch.Tensor]) -> float:
        """Validation loss of base + delta. The base model is changed in place and restored bit for bit."""
        with added(self.base.model, delta):
            return eval_loss(self.base.model, self.rows)

    def check(self, delta: dict[str, torch.Tensor]) -> tuple[dict[str, Any], str | None]:
        """-> (losses for the ledger, the rejection reason or None)."""
        loss, base_loss = self.loss_with(delta), self.base_loss
        bound = base_loss * (1 + self.config.quality_threshold)
        info = {"validation_loss": loss, "base_validation_loss": base_loss}
        if not math.isfinite(loss) or loss > bound:
            return info, (f"validation loss {loss:.4f} is above the allowed {bound:.4f} (base loss {base_loss:.4f} "
                          f"x (1 + quality_threshold {self.config.quality_threshold}))")
        return info, None
