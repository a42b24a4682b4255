"""What the hardware at hand can do, so defaults fit it instead of a datacenter GPU.

torch is imported inside the functions: core stays importable without it.
"""

from __future__ import annotations

import resource
import sys
from functools import cache


@cache
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
    import torch

    if torch.cuda.is_available():
        return bool(torch.cuda.is_bf16_supported())
    return cpu_supports_bf16()


def has_accelerator() -> bool:
    """A CUDA, XPU or MPS device is visible."""
    import torch

    xpu = hasattr(torch, "xpu") and torch.xpu.is_available()
    return bool(torch.cuda.is_available() or xpu or torch.backends.mps.is_available())


def available_memory_bytes() -> int:
    import torch

    if torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info()
        return int(free)
    import psutil

    return int(psutil.virtual_memory().available)


def peak_memory_bytes() -> int:
    """Peak GPU memory allocated, or the process's peak resident memory on CPU."""
    import torch

    if torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)
