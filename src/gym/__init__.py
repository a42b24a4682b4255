"""Gym: fine-tune, align, compress and serve LLMs on the Hugging Face stack.

    from gym import Trainer, TrainingConfig
    Trainer(TrainingConfig(model="smollm2-135m", algorithm="sft", dataset="alpaca_en_demo")).train()

`import gym` is light (no torch, no transformers): the names below load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gym.core.deepspeed_probe import import_deepspeed_only_when_used
from gym.core.library_noise import quiet_optional_extensions
from gym.core.version import __version__

# Before anything imports transformers, which imports torchao and bitsandbytes (gym.core.library_noise).
quiet_optional_extensions()
# Before anything imports accelerate, which would import DeepSpeed to unwrap every model (gym.core.deepspeed_probe).
import_deepspeed_only_when_used()

if TYPE_CHECKING:
    from gym.delta.bitdelta import BitDeltaConfig, BitDeltaQuantizer
    from gym.delta.deltaquant import DeltaQuantConfig, DeltaQuantizer
    from gym.delta.tensor_quant import QuantMethod
    from gym.infer.chat import ChatModel
    from gym.personalization.trainer import PersonalizedTrainer
    from gym.python_api import Trainer, TrainingConfig
    from gym.soup import AggregationMethod, DeltaSoup, DeltaSoupConfig
    from gym.tfgrpo.config import GRPOConfig
    from gym.tfgrpo.trainer import TrainingFreeGRPO

_LAZY = {"Trainer": "gym.python_api", "TrainingConfig": "gym.python_api", "ChatModel": "gym.infer.chat",
         "PersonalizedTrainer": "gym.personalization.trainer", "BitDeltaConfig": "gym.delta.bitdelta",
         "BitDeltaQuantizer": "gym.delta.bitdelta", "DeltaQuantConfig": "gym.delta.deltaquant",
         "DeltaQuantizer": "gym.delta.deltaquant", "QuantMethod": "gym.delta.tensor_quant",
         "DeltaSoup": "gym.soup", "DeltaSoupConfig": "gym.soup", "AggregationMethod": "gym.soup",
         "TrainingFreeGRPO": "gym.tfgrpo.trainer", "GRPOConfig": "gym.tfgrpo.config"}

__all__ = ["AggregationMethod", "BitDeltaConfig", "BitDeltaQuantizer", "ChatModel", "DeltaQuantConfig",
           "DeltaQuantizer", "DeltaSoup", "DeltaSoupConfig", "GRPOConfig", "PersonalizedTrainer", "QuantMethod",
           "Trainer", "TrainingConfig", "TrainingFreeGRPO", "__version__"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'gym' has no attribute {name!r}")
