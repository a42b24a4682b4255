"""What the hardware at hand can do, so defaults fit it instead of a datacenter GPU."""

from __future__ import annotations

import resource
import sys
from functools import lru_cache
from typing import Any

import torch


@lru_cache(maxsize=None)
def cpu_supports_bf16() -> bool:
    """True when the CPU has native bf16 matrix instructions (without them bf16 is emulated and slow)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            flags = handle.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def native_bf16() -> bool:
    """Whether bf16 mixed precision is the fast choice on the device training will use."""
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    return cpu_supports_bf16()


def available_memory_bytes() -> int:
    if torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info()
        return int(free)
    import psutil

    return int(psutil.virtual_memory().available)


def activation_bytes(config: Any, tokens_per_step: int, dtype_bytes: int = 4) -> int:
    """Rough size of the activations a decoder keeps for the backward pass, without checkpointing.

    Per token and layer: about 16 hidden-size vectors (norms, q/k/v/o, residuals) and 5
    intermediate-size vectors (gate, up, activation, product, down input); calibrated against a
    measured +1.3 GB for SmolLM2-135M at ~1,000 tokens per step.
    """
    hidden = config.hidden_size
    intermediate = getattr(config, "intermediate_size", 4 * hidden)
    per_token = config.num_hidden_layers * (16 * hidden + 5 * intermediate) * dtype_bytes
    return tokens_per_step * per_token


def needs_checkpointing(model: Any, tokens_per_step: int, budget_share: float = 0.5) -> bool:
    """Recompute activations only when keeping them would take over half the free memory."""
    need = activation_bytes(model.config, tokens_per_step)
    return need > budget_share * available_memory_bytes()


def peak_memory_bytes() -> int:
    if torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)
