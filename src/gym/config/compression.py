"""The seeds' `quantization:` key: compress the trained model as a delta from its base when training ends.

    quantization: bitdelta          # a method name: bitdelta | deltaquant | int8 | int4 | int2 | ternary | binary
    quantization:                   # or a block
      method: bitdelta              # bitdelta (1 bit + distilled scales) or deltaquant (with bits: 8 | 4 | 2)
      bits: 1
      group_size: 128               # one scale per this many weights of a row
      safety_threshold: 0.6         # bitdelta: a matrix whose 1-bit error exceeds this is kept at int8
      enable_deltasoup: true        # mark the delta as contributable to a DeltaSoup
      distill_steps: 200            # bitdelta: scale-distillation steps on the training data

It is the same as the flat delta_* keys (delta_compression, delta_group_size, ...), which it becomes here.
This is not QLoRA: a 4-bit base during training is `quantization_bit: 4` (LLaMA-Factory's key).
"""

from __future__ import annotations

from typing import Any

from gym.config.blocks import block_of, set_flat
from gym.core.errors import ConfigError
from gym.core.names import did_you_mean

KEY = "quantization"
METHODS = ("bitdelta", "deltaquant", "int8", "int4", "int2", "ternary", "binary")
# block key -> the flat key it sets
FLAT = {"group_size": "delta_group_size", "safety_threshold": "delta_safety_threshold",
        "enable_deltasoup": "delta_enable_deltasoup", "distill_steps": "delta_distill_steps"}
BLOCK_KEYS = ("method", "bits", *FLAT)
DELTAQUANT_BITS = {8: "int8", 4: "int4", 2: "int2", 1: "binary"}


def expand(config: dict[str, Any]) -> dict[str, Any]:
    """The config with `quantization:` replaced by the delta_* keys it means."""
    if KEY not in config:
        return config
    value = config[KEY]
    out = {k: v for k, v in config.items() if k != KEY}
    if isinstance(value, (bool, int, float)):
        raise ConfigError(f"'{KEY}' names how the trained model is stored as a delta from its base "
                          f"({', '.join(METHODS)}), got {value!r}; for QLoRA's 4-bit base during training use "
                          f"'quantization_bit: {value}'.")
    block = block_of({KEY: {"method": value}} if isinstance(value, str) else config, KEY, BLOCK_KEYS)
    if "method" not in block:
        raise ConfigError(f"'{KEY}' needs a method: one of {', '.join(METHODS)}.")
    _set(out, "delta_compression", _method(block["method"], block.get("bits")))
    for key, flat in FLAT.items():
        if key in block:
            _set(out, flat, block[key])
    return out


def _method(method: Any, bits: Any) -> str:
    name = str(method).lower()
    if name not in METHODS:
        raise ConfigError(f"'{KEY}.method' is one of {', '.join(METHODS)}; got {method!r}."
                          f"{did_you_mean(name, METHODS)}")
    if name == "bitdelta":
        if bits not in (None, 1):
            raise ConfigError(f"'{KEY}': BitDelta stores 1 bit per weight, got bits: {bits}; for 2, 4 or 8 bits use "
                              "method: deltaquant.")
        return name
    if name == "deltaquant":
        if bits is None:
            return "int8"
        if bits not in DELTAQUANT_BITS:
            raise ConfigError(f"'{KEY}.bits' for deltaquant is 8, 4, 2 or 1; got {bits!r}.")
        return DELTAQUANT_BITS[bits]
    if bits is not None and DELTAQUANT_BITS.get(bits) != name and not (name == "ternary" and bits == 2):
        raise ConfigError(f"'{KEY}': method {name} and bits: {bits} disagree; keep one.")
    return name


def _set(config: dict[str, Any], key: str, value: Any) -> None:
    set_flat(config, KEY, key, value)
