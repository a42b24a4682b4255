"""Gym: fine-tune, align, compress and serve LLMs on the Hugging Face stack.

    from gym import Trainer, TrainingConfig
    Trainer(TrainingConfig(model="smollm2-135m", algorithm="sft", dataset="alpaca_en_demo")).train()
"""

from __future__ import annotations

__version__ = "0.1.0"

from gym.api import Trainer, TrainingConfig  # noqa: E402

__all__ = ["Trainer", "TrainingConfig", "__version__"]
