"""Personalized variants: per-user fine-tunes of one base, stored as 1-bit deltas (gym.delta)."""

from gym.delta.bitdelta import BitDeltaConfig
from gym.delta.deltaquant import DeltaQuantConfig
from gym.personalization.store import VariantError, VariantRecord, VariantStore
from gym.personalization.trainer import PersonalizedTrainer

__all__ = ["BitDeltaConfig", "DeltaQuantConfig", "PersonalizedTrainer", "VariantError", "VariantRecord", "VariantStore"]
