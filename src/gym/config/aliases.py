"""The other spellings of Gym's keys, in one place: the names the Gym documents (and LLaMA-Factory, and older
transformers) use for keys Gym calls something else. Inside Gym each thing has one name; these are translated here,
once, when a config is read, and nowhere else.

Key spellings:
- `model` -> model_name_or_path, `algorithm` -> stage, `group_size` -> num_generations (GRPO's answers per prompt);
- LLaMA-Factory's `warmup_ratio` -> warmup_steps (transformers 5: a value below 1 is a ratio), `group_by_length` ->
  train_sampling_strategy, `enable_liger_kernel` -> use_liger_kernel;
- `quantization_method: bitsandbytes` -> bnb; LLaMA-Factory's other methods (gptq, eetq, ...) refused with the
  reason; `infer_backend: huggingface` -> hf; `disable_gradient_checkpointing: true` -> gradient_checkpointing:
  false.

Blocks, each replaced by the flat keys it means (a key the config also sets must agree):

    quantization: bitdelta          # the trained model stored as a compressed delta from its base (delta_* keys);
    quantization:                   # NOT a quantized base during training, which is `quantization_bit: 4` (QLoRA)
      method: bitdelta              # bitdelta (1 bit + distilled scales) or deltaquant (with bits: 8 | 4 | 2)
      bits: 1
      group_size: 128               # delta_group_size: one scale per this many weights of a row
      safety_threshold: 0.6         # delta_safety_threshold: a matrix whose 1-bit error exceeds this stays int8
      enable_deltasoup: true        # delta_enable_deltasoup: mark the delta as contributable to a DeltaSoup
      distill_steps: 200            # delta_distill_steps: scale distillation on the training data

    serving:                        # how gym api / gym chat serve the model; a training run ignores it
      model_format: gguf            # hf (the default) | gguf: infer_backend llamacpp
      quantization: int4            # infer_dtype: the weights in memory (int4 | int8 | bfloat16 | float16 | float32)
      batch_size: 32                # gym api: requests decoded together (--max_batch_size)
      max_concurrent: 100           # gym api: requests admitted at once, decoding or queued
      cache_size: 10GB              # infer_prefix_cache_mb: the prompt-prefix KV cache

`sequence_parallel: true` is refused with what would provide it. The `distributed:` block is its own concern
(gym.config.distributed), built on `block_of`/`set_flat` below. The Python names of the documents
(`gym.quantization`, `zoo.gym`) are facades at the door and re-export Gym's delta and soup classes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from gym.config.coerce import coerce
from gym.core.errors import ConfigError
from gym.core.names import did_you_mean

KEY_ALIASES: dict[str, str] = {
    "model": "model_name_or_path",
    "algorithm": "stage",
    "warmup_ratio": "warmup_steps",
    "group_by_length": "train_sampling_strategy",
    "enable_liger_kernel": "use_liger_kernel",
    "group_size": "num_generations",
    "disable_gradient_checkpointing": "gradient_checkpointing",  # the value inverted
}

# LLaMA-Factory's quantization methods that Gym's quantization_method does not offer, and why.
_PREQUANTIZED = ("loads a checkpoint already quantized with it: give that checkpoint as model_name_or_path "
                 "without quantization_bit (transformers reads its quantization from its config.json, where its "
                 "package is installed). To quantize on load, use quantization_method: bnb.")
LLAMAFACTORY_QUANTIZERS = {
    "gptq": _PREQUANTIZED, "awq": _PREQUANTIZED, "aqlm": _PREQUANTIZED,
    "eetq": "EETQ's 8-bit kernels need a CUDA GPU and the eetq package, and Gym does not offer them; for 8 bits "
            "use quantization_method: bnb (CPU and CUDA) or torchao.",
    "quanto": "optimum-quanto is not offered by Gym; use quantization_method: bnb (4 or 8 bits) or torchao (8).",
    "mxfp4": "MXFP4 loads a checkpoint already quantized that way (gpt-oss): give it without quantization_bit.",
    "fp8": "FP8 loads a checkpoint already quantized that way: give it without quantization_bit. To quantize on "
           "load, use quantization_method: bnb.",
}

SEQUENCE_PARALLEL = (
    "'{key}: {value}': sequence parallelism (one long sequence split across GPUs) is not in Gym yet. It would come "
    "from DeepSpeed-Ulysses (deepspeed.sequence.layer.DistributedAttention) or ring attention (the ring-flash-attn "
    "package) across several CUDA GPUs. For long sequences today: gradient checkpointing, shift_attn (LongLoRA) "
    "or a shorter cutoff_len; remove the key.")

_FALSE_WORDS = ("false", "no", "off", "0", "1")  # sequence_parallel_size 1 is off too

# `gym export --quantization q4_k_m` / `Trainer.export(path, quantization=...)`: the documents' name for the weight
# type of the exported file (a GGUF type, or bitdelta); Gym's is export_type (--type).
EXPORT_KEY_ALIASES: dict[str, str] = {"quantization": "export_type", "export_quantization": "export_type"}


# What a run's gym_config.yaml records for its reader besides the settings: the folder the base resolved to. The
# file is "the config as run", so it is read back as a config (`gym train saves/run/gym_config.yaml`) without it.
RECORDED_ONLY = ("resolved_model_path",)
HIDDEN = "<hidden>"  # what gym_config.yaml writes in place of a credential: nothing to read back


def canonical(config: dict[str, Any]) -> dict[str, Any]:
    """The config in Gym's own names: keys renamed, values respelt, the `quantization:` and `serving:` blocks
    expanded. Two spellings of one key must agree."""
    out: dict[str, Any] = {}
    spelt: dict[str, str] = {}  # target -> the key that set it, for the error naming both
    for raw_key, value in config.items():
        key = str(raw_key).replace("-", "_")
        if key in RECORDED_ONLY or (key.endswith("hub_token") and value == HIDDEN):
            continue
        target = KEY_ALIASES.get(key, key)
        if key == "gradient_checkpointing" and str(value).lower() == "auto":
            value = None  # unset: chosen by estimated memory when the run starts
        elif key == "group_by_length":
            value = "group_by_length" if coerce(key, value, bool) else "random"
        elif key in ("sequence_parallel", "sequence_parallel_size"):
            if value is None or value is False or (not isinstance(value, bool) and str(value).lower() in _FALSE_WORDS):
                continue
            raise ConfigError(SEQUENCE_PARALLEL.format(key=key, value=value))
        elif key == "quantization_method" and str(value).lower() == "bitsandbytes":
            value = "bnb"  # the package's own name, as the documents write it
        elif key == "quantization_method" and str(value).lower() in LLAMAFACTORY_QUANTIZERS:
            raise ConfigError(f"'quantization_method: {value}' (LLaMA-Factory's) is not supported: "
                              f"{LLAMAFACTORY_QUANTIZERS[str(value).lower()]}")
        elif key == "disable_gradient_checkpointing":
            value = not coerce(key, value, bool)
        elif key == "infer_backend" and str(value).lower() == "huggingface":
            value = "hf"  # LLaMA-Factory's name for the transformers engine
        elif key == "infer_backend" and str(value).lower() in ("sglang", "ktransformers"):
            raise ConfigError(f"'infer_backend: {value}' (LLaMA-Factory's) is not supported: Gym serves through "
                              "fast (its own engine), hf (transformers), vllm or llamacpp; use auto to let it choose.")
        elif key == "warmup_ratio":
            value = coerce(key, value, float)
            if not 0 <= value < 1:
                raise ConfigError(f"'warmup_ratio' expects a number in [0, 1), got {config[raw_key]!r}.")
        if target in out and out[target] != value:
            raise ConfigError(f"'{spelt[target]}' and '{key}' both set, to values that disagree; keep one.")
        out[target], spelt[target] = value, key
    return _expand_serving(_expand_delta_block(out))


# ---------------------------------------------------------------- blocks

def block_of(config: dict[str, Any], name: str, keys: Sequence[str]) -> dict[str, Any]:
    """config[name] as a dict whose every key is one of `keys` (an unknown one names the closest)."""
    block = config.get(name) or {}
    if not isinstance(block, dict):
        raise ConfigError(f"'{name}' is a block of keys ({', '.join(keys)}), got {block!r}.")
    for key in block:
        if key not in keys:
            raise ConfigError(f"Unknown key '{name}.{key}'.{did_you_mean(str(key), keys)} It takes: "
                              f"{', '.join(keys)}.")
    return block


def set_flat(config: dict[str, Any], block_name: str, key: str, value: Any) -> None:
    """config[key] = value, unless the config already sets key to something else."""
    if key in config and config[key] != value:
        raise ConfigError(f"'{block_name}:' sets '{key}: {value}', and the config also has '{key}: {config[key]}'; "
                          "keep one.")
    config[key] = value


# ---------------------------------------------------------------- `quantization:`: delta compression after training

DELTA_BLOCK = "quantization"
DELTA_METHODS = ("bitdelta", "deltaquant", "int8", "int4", "int2", "ternary", "binary")
_DELTA_FLAT = {"group_size": "delta_group_size", "safety_threshold": "delta_safety_threshold",
               "enable_deltasoup": "delta_enable_deltasoup", "distill_steps": "delta_distill_steps"}
_DELTA_KEYS = ("method", "bits", *_DELTA_FLAT)
_DELTAQUANT_BITS = {8: "int8", 4: "int4", 2: "int2", 1: "binary"}
_DELTA_BLOCK_FLAT = {"method": "delta_compression", "bits": "delta_compression", **_DELTA_FLAT}


def _expand_delta_block(config: dict[str, Any]) -> dict[str, Any]:
    if DELTA_BLOCK not in config:
        return config
    value = config[DELTA_BLOCK]
    out = {k: v for k, v in config.items() if k != DELTA_BLOCK}
    if isinstance(value, (bool, int, float)):
        raise ConfigError(f"'{DELTA_BLOCK}' names how the trained model is stored as a delta from its base "
                          f"({', '.join(DELTA_METHODS)}), got {value!r}; for QLoRA's 4-bit base during training use "
                          f"'quantization_bit: {value}'.")
    block = block_of({DELTA_BLOCK: {"method": value}} if isinstance(value, str) else config, DELTA_BLOCK, _DELTA_KEYS)
    if "method" not in block:
        raise ConfigError(f"'{DELTA_BLOCK}' needs a method: one of {', '.join(DELTA_METHODS)}.")
    set_flat(out, DELTA_BLOCK, "delta_compression", _delta_method(block["method"], block.get("bits")))
    for key, flat in _DELTA_FLAT.items():
        if key in block:
            set_flat(out, DELTA_BLOCK, flat, block[key])
    return out


def _delta_method(method: Any, bits: Any) -> str:
    name = str(method).lower()
    if name not in DELTA_METHODS:
        raise ConfigError(f"'{DELTA_BLOCK}.method' is one of {', '.join(DELTA_METHODS)}; got {method!r}."
                          f"{did_you_mean(name, DELTA_METHODS)}")
    if name == "bitdelta":
        if bits not in (None, 1):
            raise ConfigError(f"'{DELTA_BLOCK}': BitDelta stores 1 bit per weight, got bits: {bits}; for 2, 4 or 8 "
                              "bits use method: deltaquant.")
        return name
    if name == "deltaquant":
        if bits is None:
            return "int8"
        if bits not in _DELTAQUANT_BITS:
            raise ConfigError(f"'{DELTA_BLOCK}.bits' for deltaquant is 8, 4, 2 or 1; got {bits!r}.")
        return _DELTAQUANT_BITS[bits]
    if bits is not None and _DELTAQUANT_BITS.get(bits) != name and not (name == "ternary" and bits == 2):
        raise ConfigError(f"'{DELTA_BLOCK}': method {name} and bits: {bits} disagree; keep one.")
    return name


def without_overridden(config: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The config (from files) less the block entries that a key given on the command line overrides: a flag wins
    over a block (`--infer_dtype int8` over `serving: {quantization: int4}`), where two spellings in one file must
    agree. A block left empty goes."""
    given = {KEY_ALIASES.get(str(key).replace("-", "_"), str(key).replace("-", "_")) for key in overrides}
    out = dict(config)
    for block_name, flat in ((SERVING_BLOCK, _SERVING_FLAT), (DELTA_BLOCK, _DELTA_BLOCK_FLAT)):
        block = out.get(block_name)
        if isinstance(block, str) and block_name == DELTA_BLOCK and "delta_compression" in given:
            del out[block_name]
        elif isinstance(block, dict):
            block_of(out, block_name, _SERVING_KEYS if block_name == SERVING_BLOCK else _DELTA_KEYS)  # typos named
            kept = {key: value for key, value in block.items() if flat.get(str(key)) not in given}
            del out[block_name]
            if block_name == DELTA_BLOCK and "delta_compression" in given:
                # the block without its method is no block: what is left of it is its flat keys
                for key, value in kept.items():
                    set_flat(out, block_name, _DELTA_BLOCK_FLAT[str(key)], value)
            elif kept:
                out[block_name] = kept
    return out


# ---------------------------------------------------------------- `serving:`: how the model is served

SERVING_BLOCK = "serving"
_SERVING_KEYS = ("model_format", "quantization", "batch_size", "max_concurrent", "cache_size")
# The flat key each entry sets (batch_size and max_concurrent are gym api's --max_batch_size and --max_waiting,
# which gym.serve.cli prefers over the block itself).
_SERVING_FLAT = {"model_format": "infer_backend", "quantization": "infer_dtype", "cache_size": "infer_prefix_cache_mb"}
_FORMATS = ("hf", "safetensors", "gguf")
_INFER_DTYPES = ("int4", "int8", "bfloat16", "float16", "float32", "auto")
_UNITS = {"": 1 / (1 << 20), "b": 1 / (1 << 20), "kb": 1 / 1024, "k": 1 / 1024, "mb": 1, "m": 1, "gb": 1024,
          "g": 1024, "tb": 1 << 20, "kib": 1 / 1024, "mib": 1, "gib": 1024}


def megabytes(value: Any) -> int:
    """'10GB', '512MB', 1024 (MB) -> whole megabytes."""
    if isinstance(value, bool):
        raise ConfigError(f"'{SERVING_BLOCK}.cache_size' is a size such as 10GB or 512MB, got {value!r}.")
    if isinstance(value, (int, float)):
        return int(value)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
    if match is None or match.group(2).lower() not in _UNITS:
        raise ConfigError(f"'{SERVING_BLOCK}.cache_size' is a size such as 10GB or 512MB, got {value!r}.")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def _expand_serving(config: dict[str, Any]) -> dict[str, Any]:
    if SERVING_BLOCK not in config:
        return config
    block = block_of(config, SERVING_BLOCK, _SERVING_KEYS)
    out = {k: v for k, v in config.items() if k != SERVING_BLOCK}
    if "model_format" in block:
        fmt = str(block["model_format"]).lower()
        if fmt not in _FORMATS:
            raise ConfigError(f"'{SERVING_BLOCK}.model_format' is one of {', '.join(_FORMATS)}; got "
                              f"{block['model_format']!r}.")
        if fmt == "gguf":  # hf/safetensors: the default engine choice (fast where it runs, else transformers)
            set_flat(out, SERVING_BLOCK, "infer_backend", "llamacpp")
    if "quantization" in block:
        dtype = str(block["quantization"]).lower()
        if dtype not in _INFER_DTYPES:
            raise ConfigError(f"'{SERVING_BLOCK}.quantization' is one of {', '.join(_INFER_DTYPES)}; got "
                              f"{block['quantization']!r}.{did_you_mean(dtype, _INFER_DTYPES)}")
        set_flat(out, SERVING_BLOCK, "infer_dtype", dtype)
    if "cache_size" in block:
        set_flat(out, SERVING_BLOCK, "infer_prefix_cache_mb", megabytes(block["cache_size"]))
    server_options(config)  # their errors now, not when the server starts
    return out


def server_options(config: dict[str, Any]) -> dict[str, int]:
    """gym api's settings from the `serving:` block: {"batch_size": .., "max_concurrent": ..} (those it sets)."""
    block = block_of(config, SERVING_BLOCK, _SERVING_KEYS)
    options: dict[str, int] = {}
    for key in ("batch_size", "max_concurrent"):
        if key in block:
            value = block[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"'{SERVING_BLOCK}.{key}' is a whole number of requests (at least 1), got "
                                  f"{value!r}.")
            options[key] = value
    return options
