"""The seeds' `serving:` block: how `gym api` (and `gym chat`) serve the model a config names.

    serving:
      model_format: gguf     # hf (safetensors, the default) | gguf (llama.cpp engine: model_name_or_path is a .gguf)
      quantization: int4     # weights in memory: int4 | int8 | bfloat16 | float16 | float32 (infer_dtype)
      batch_size: 32         # gym api: requests decoded together (--max_batch_size)
      max_concurrent: 100    # gym api: requests admitted at once, decoding or queued (--max_waiting: the rest)
      cache_size: 10GB       # prompt-prefix KV cache (infer_prefix_cache_mb)

Engine keys become model keys here; the server's own two are read by `gym api` (server_options), and a
training run ignores the block, so one YAML can train and then serve.
"""

from __future__ import annotations

import re
from typing import Any

from gym.config.blocks import block_of, set_flat
from gym.core.errors import ConfigError
from gym.core.names import did_you_mean

KEY = "serving"
KEYS = ("model_format", "quantization", "batch_size", "max_concurrent", "cache_size")
FORMATS = ("hf", "safetensors", "gguf")
DTYPES = ("int4", "int8", "bfloat16", "float16", "float32", "auto")
_UNITS = {"": 1 / (1 << 20), "b": 1 / (1 << 20), "kb": 1 / 1024, "k": 1 / 1024, "mb": 1, "m": 1, "gb": 1024,
          "g": 1024, "tb": 1 << 20, "kib": 1 / 1024, "mib": 1, "gib": 1024}


def megabytes(value: Any) -> int:
    """'10GB', '512MB', 1024 (MB) -> whole megabytes."""
    if isinstance(value, bool):
        raise ConfigError(f"'{KEY}.cache_size' is a size such as 10GB or 512MB, got {value!r}.")
    if isinstance(value, (int, float)):
        return int(value)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
    if match is None or match.group(2).lower() not in _UNITS:
        raise ConfigError(f"'{KEY}.cache_size' is a size such as 10GB or 512MB, got {value!r}.")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def expand(config: dict[str, Any]) -> dict[str, Any]:
    """The config with `serving:` replaced by the engine keys it means (the server's own keys dropped)."""
    if KEY not in config:
        return config
    block = block_of(config, KEY, KEYS)
    out = {k: v for k, v in config.items() if k != KEY}
    if "model_format" in block:
        fmt = str(block["model_format"]).lower()
        if fmt not in FORMATS:
            raise ConfigError(f"'{KEY}.model_format' is one of {', '.join(FORMATS)}; got {block['model_format']!r}.")
        if fmt == "gguf":  # hf/safetensors: the default engine choice (fast where it runs, else transformers)
            _set(out, "infer_backend", "llamacpp")
    if "quantization" in block:
        dtype = str(block["quantization"]).lower()
        if dtype not in DTYPES:
            raise ConfigError(f"'{KEY}.quantization' is one of {', '.join(DTYPES)}; got {block['quantization']!r}."
                              f"{did_you_mean(dtype, DTYPES)}")
        _set(out, "infer_dtype", dtype)
    if "cache_size" in block:
        _set(out, "infer_prefix_cache_mb", megabytes(block["cache_size"]))
    server_options(config)  # their errors now, not when the server starts
    return out


def server_options(config: dict[str, Any]) -> dict[str, int]:
    """gym api's settings from the block: {"batch_size": .., "max_concurrent": ..} (those it sets)."""
    block = block_of(config, KEY, KEYS)
    options: dict[str, int] = {}
    for key in ("batch_size", "max_concurrent"):
        if key in block:
            value = block[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"'{KEY}.{key}' is a whole number of requests (at least 1), got {value!r}.")
            options[key] = value
    return options


def _set(config: dict[str, Any], key: str, value: Any) -> None:
    set_flat(config, KEY, key, value)
