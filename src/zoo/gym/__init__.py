"""`from zoo.gym import PersonalizedTrainer, BitDeltaConfig, ...`: the Gym documents' spelling of `gym`'s API."""

from __future__ import annotations

from typing import Any

import gym as _gym

__all__ = list(_gym.__all__)


def __getattr__(name: str) -> Any:
    return getattr(_gym, name)
