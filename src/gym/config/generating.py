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
        allowed = {"temperature": "0 or more", "top_p": "in (0, 1]", "top_k": "0 or more",
                   "max_new_tokens": "at least 1", "repetition_penalty": "above 0"}
        ok = {"temperature": self.temperature is None or self.temperature >= 0,
              "top_p": self.top_p is None or 0 < self.top_p <= 1,
              "top_k": self.top_k is None or self.top_k >= 0,
              "max_new_tokens": self.max_new_tokens is None or self.max_new_tokens >= 1,
              "repetition_penalty": self.repetition_penalty is None or self.repetition_penalty > 0}
        for key, good in ok.items():
            if not good:
                raise ConfigError(f"'{key}' must be {allowed[key]}, got {getattr(self, key)}.")

    def explicit(self) -> dict[str, Any]:
        """The keys the user (or a saved training config) set."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def resolve(self, model_defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Every decoding setting: the user's, else the model's generation_config's, else Gym's."""
        model_defaults = model_defaults or {}
        resolved = {key: model_defaults.get(key, default) for key, default in DECODING_DEFAULTS.items()}
        resolved = {k: v for k, v in resolved.items() if v is not None}
        return {**DECODING_DEFAULTS, **resolved, **self.explicit()}
