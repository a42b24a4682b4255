"""A store's base model: who it is (name, fingerprint, parameter count) and the shape of every parameter, which
every variant must fit before it is stored.

The fingerprint (gym.delta.format) says a delta was made from this base; it cannot say what shapes the base has,
and a LoRA adapter carries none. So the store keeps the shapes too, read from the base model's config alone (the
model is built on the meta device: no weight is read), and every variant's deltas are checked against them: a
variant the server could not add to its base is refused when it is added, not on every request.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gym.core.errors import ConfigError, GymError
from gym.core.files import MANIFEST_FILE

Shapes = dict[str, list[int]]


def base_shapes(name: str | None, source: str) -> Shapes:
    """Every parameter's shape (`named_parameters`: a tied weight once) of the base model `name`, for checking the
    variant `source` against it."""
    if not name:
        raise ConfigError(f"{source} does not name the base model it was made from, so its shapes cannot be checked "
                          "against it; compress it with `gym delta compress --base BASE`.")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from gym.models.loader import resolve_model_path

    try:
        path = resolve_model_path(name)
        config = AutoConfig.from_pretrained(path)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except GymError as exc:
        raise ConfigError(f"{source} was made from the base {name!r}, which is needed to check the variant's shapes "
                          f"and cannot be loaded here: {exc}") from None
    except (OSError, ValueError, KeyError) as exc:  # transformers: not a model folder, an unknown architecture
        raise ConfigError(f"{source} was made from the base {name!r}, whose config cannot be read to check the "
                          f"variant's shapes: {exc}") from None
    return {param: list(tensor.shape) for param, tensor in model.named_parameters()}


def describe_base(name: str) -> dict[str, Any]:
    """{"name", "fingerprint", "parameters"} of the base `name`, as `gym delta compress` writes them in a delta's
    header (its float32 weights are read: an adapter carries no fingerprint, and a store needs one)."""
    from gym.delta.format import fingerprint
    from gym.delta.weights import load_model, parameters

    tensors = parameters(load_model(name))
    return {"fingerprint": fingerprint(tensors), "name": name,
            "parameters": sum(t.numel() for t in tensors.values())}


def adapter_base(folder: Path) -> str:
    """The base a LoRA adapter folder was trained on: a Gym run's manifest says, else PEFT's adapter_config.json."""
    for file, key in ((MANIFEST_FILE, "base_model"), ("adapter_config.json", "base_model_name_or_path")):
        try:
            value = json.loads((folder / file).read_text(encoding="utf-8")).get(key)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(value, str) and value:
            return value
    raise ConfigError(f"{folder}: the adapter does not name the base model it was trained on (adapter_config.json "
                      "has no base_model_name_or_path); add a delta of that base to the store first.")


def check_shapes(shapes: dict[str, tuple[int, ...]], base: Shapes, source: str) -> None:
    """Every parameter a variant changes is one of the base's, with the base's shape."""
    for param, shape in shapes.items():
        if param not in base:
            raise ConfigError(f"{source} changes {param}, which the store's base model does not have: it was made "
                              "from another model.")
        if list(shape) != base[param]:
            raise ConfigError(f"{source}: {param} has shape {list(shape)}, the store's base model's is {base[param]}; "
                              "it was made from a model of another size.")
