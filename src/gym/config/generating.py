"""Decoding settings for chat, serving and batch inference: one set of defaults, the model's first.

A key left unset takes the model's own `generation_config.json` value when the model ships one
(Qwen3, for instance, asks for temperature 0.6, top_p 0.95, top_k 20), else `DECODING_DEFAULTS`.
The engine's per-request `SamplingParams` start from the same resolved values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from gym.core.errors import ConfigError

if TYPE_CHECKING:
    from gym.config.args import TrainArgs

# Gym's choice where neither the user nor the model says: moderate sampling, no truncation tricks.
DECODING_DEFAULTS: dict[str, Any] = {
    "do_sample": True,
    "temperature": 0.7,
    "top_p": 1.0,
    "top_k": 0,
    "max_new_tokens": 512,
    "repetition_penalty": 1.0,
}


def _unset(key: str, help_text: str) -> Any:
    default = DECODING_DEFAULTS[key]
    help_text = f"{help_text} (unset: the model's generation_config, else {default})."
    return field(default=None, metadata={"help": help_text})


@dataclass
class GeneratingArguments:
    do_sample: bool | None = _unset("do_sample", "Sample; false decodes greedily")
    temperature: float | None = _unset("temperature", "Sampling temperature")
    top_p: float | None = _unset("top_p", "Nucleus sampling mass (1.0 = off)")
    top_k: int | None = _unset("top_k", "Sample among the k most likely tokens (0 = off)")
    max_new_tokens: int | None = _unset("max_new_tokens", "Most tokens generated per answer")
    repetition_penalty: float | None = _unset("repetition_penalty", "Penalty on repeated tokens (1.0 = none)")

    def validate(self, args: TrainArgs[Any]) -> None:
        checks = {
            "temperature": lambda v: v >= 0, "top_p": lambda v: 0 < v <= 1, "top_k": lambda v: v >= 0,
            "max_new_tokens": lambda v: v >= 1, "repetition_penalty": lambda v: v > 0,
        }
        for key, ok in checks.items():
            value = getattr(self, key)
            if value is not None and not ok(value):
                raise ConfigError(f"'{key}' is out of range: {value}.")

    def explicit(self) -> dict[str, Any]:
        """The keys the user (or a saved training config) set."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def resolve(self, model_defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Every decoding setting: the user's, else the model's generation_config's, else Gym's."""
        model_defaults = model_defaults or {}
        resolved = {key: model_defaults.get(key, default) for key, default in DECODING_DEFAULTS.items()}
        resolved = {k: v for k, v in resolved.items() if v is not None}
        return {**DECODING_DEFAULTS, **resolved, **self.explicit()}
