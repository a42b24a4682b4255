"""A variant's files -> per-parameter deltas in the form the batched engine applies per row
(gym.infer.fast.deltas): a Gym delta file (BitDelta, DeltaQuant) or a LoRA adapter folder.

1-bit entries keep their packed codes as they are on disk; other encodings stay coded and are expanded
when used (into the engine's bounded cache); a LoRA adapter becomes its A and scaled B per module.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from gym.core.errors import ConfigError
from gym.delta.format import load_delta
from gym.delta.tensor_quant import Encoded, QuantMethod, dequantize, encoded_bytes
from gym.infer.fast.deltas import CodedDelta, LowRankDelta, ParamDelta, SignDelta

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def deltas_from_file(path: str | os.PathLike[str]) -> tuple[dict[str, ParamDelta], dict[str, Any]]:
    """-> (deltas per parameter, the file's header), the file checked whole first (gym.delta.format), and each
    entry in the form the engine serves it checked too: a coded entry is expanded once here, so that a file the
    engine could not expand is refused now, by name, rather than inside a decoding step every user shares."""
    entries, header = load_delta(path)
    deltas: dict[str, ParamDelta] = {}
    for name, entry in entries.items():
        try:
            deltas[name] = delta = _from_entry(entry)
            if isinstance(delta, CodedDelta):
                expanded = delta.dense()
                if tuple(expanded.shape) != tuple(delta.shape) or not torch.isfinite(expanded).all():
                    raise ValueError("it expands to the wrong shape or to NaN/Inf")
        except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as exc:  # parameters that do not fit
            raise ConfigError(f"{path}: {name} cannot be served ({exc}); the delta is damaged.") from None
    return deltas, header


def _from_entry(entry: Encoded | torch.Tensor) -> ParamDelta:
    if isinstance(entry, torch.Tensor):
        if entry.dim() < 2:
            return entry.float()
        dense = entry
        return CodedDelta(tuple(dense.shape), lambda: dense.float(), dense.numel() * dense.element_size())
    shape = tuple(entry.shape)
    if QuantMethod(entry.method) is QuantMethod.BINARY and len(shape) == 2:
        rows, cols = shape
        granularity = entry.params["granularity"]
        scale = entry.tensors["scale"].float()
        if granularity == "group":
            group_size = int(entry.params["group_size"])
            grid = scale.reshape(rows, math.ceil(cols / group_size))
        else:  # one scale per matrix or per row, as a one-group-per-row grid
            group_size, grid = cols, scale.reshape(-1, 1).expand(rows, 1)
        bits = entry.tensors["codes"].reshape(-1)[:math.ceil(rows * cols / 8)]
        return SignDelta(bits.contiguous(), grid.contiguous(), group_size, (rows, cols))
    if len(shape) < 2:
        return dequantize(entry)
    return CodedDelta(shape, lambda: dequantize(entry), encoded_bytes(entry))


def deltas_from_adapter(folder: str | os.PathLike[str]) -> dict[str, ParamDelta]:
    """A PEFT LoRA adapter folder -> {base weight name: LowRankDelta(A, B * scaling)}. Adapter kinds whose
    update is not B @ A * scaling (DoRA, per-module ranks or alphas) and modules_to_save are refused."""
    folder = Path(folder)
    config_path, weights_path = folder / ADAPTER_CONFIG, folder / ADAPTER_WEIGHTS
    if not config_path.is_file() or not weights_path.is_file():
        raise ConfigError(f"{folder} is not a LoRA adapter folder: it needs {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS}.")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{config_path} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{config_path} holds a JSON {type(config).__name__}, not an adapter config object.")
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise ConfigError(f"{config_path}: peft_type {config.get('peft_type')!r}; variants can be LoRA adapters only.")
    for key in ("use_dora", "rank_pattern", "alpha_pattern", "modules_to_save"):
        if config.get(key):
            raise ConfigError(f"{config_path}: {key} is set; a served LoRA variant must be a plain LoRA (B @ A * "
                              "lora_alpha / r on each target). Merge it and compress the delta instead "
                              "(gym delta compress).")
    rank, alpha = config.get("r", 8), config.get("lora_alpha", config.get("r", 8))
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1 or not isinstance(alpha, (int, float)) \
            or not math.isfinite(alpha):
        raise ConfigError(f"{config_path}: r must be a positive integer and lora_alpha a finite number "
                          f"(r={rank!r}, lora_alpha={alpha!r}).")
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    try:
        tensors = load_file(str(weights_path))
    except Exception as exc:
        raise ConfigError(f"{weights_path} is not a readable safetensors file: {exc}") from None
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        for part in ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B"):
            marker = f".{part}."
            if marker in key:
                module = key.split(marker)[0].removeprefix("base_model.model.")
                pairs.setdefault(module, {})[part] = tensor.float()
                break
        else:
            raise ConfigError(f"{weights_path}: {key} is not a LoRA A/B weight.")
    deltas: dict[str, ParamDelta] = {}
    for module, parts in pairs.items():
        for part, tensor in parts.items():
            if tensor.dim() != 2 or not torch.isfinite(tensor).all():
                raise ConfigError(f"{weights_path}: {module}'s {part} is not a finite matrix (shape "
                                  f"{list(tensor.shape)}, or NaN/Inf); the adapter is damaged.")
        if "lora_A" in parts and "lora_B" in parts:
            delta = LowRankDelta(parts["lora_A"], parts["lora_B"] * scaling)
        elif "lora_embedding_A" in parts and "lora_embedding_B" in parts:
            # An embedding's update is (B @ A).T: [vocab, hidden] = A.T [vocab, r] @ B.T [r, hidden].
            delta = LowRankDelta(parts["lora_embedding_B"].T.contiguous(),
                                 (parts["lora_embedding_A"].T * scaling).contiguous())
        else:
            raise ConfigError(f"{weights_path}: {module} has only one of its LoRA A/B weights.")
        if delta.up.shape[1] != delta.down.shape[0]:
            raise ConfigError(f"{weights_path}: {module}'s LoRA A and B have different ranks "
                              f"({delta.down.shape[0]} and {delta.up.shape[1]}); the adapter is damaged.")
        deltas[f"{module}.weight"] = delta
    if not deltas:
        raise ConfigError(f"{weights_path} holds no LoRA weights.")
    return deltas
