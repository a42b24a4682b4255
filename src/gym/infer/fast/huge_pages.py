"""The fast engine's weights in huge pages.

A decode step streams every weight once. In 4 KB pages that is a TLB miss every 4 KB, and the hardware
prefetchers stop at every page boundary; in 2 MB pages (Linux's transparent huge pages, asked for with
madvise) the same kernels ran a one-row float32 step's layers 1.19x faster and a one-row int8 step's 1.15x
(the AVX2 variant, alternating between the two copies in one process). Weights come from a safetensors file
mapped in 4 KB pages, from packing, or from torch's allocator, none of which asks for huge pages, so the
decoder copies them into one mapping that does (a few tens of milliseconds at start-up; the copies replace
the originals, which are freed where nothing else holds them).

GYM_HUGE_PAGES=0 turns it off. Where the system has no transparent huge pages (another OS, or the kernel's
setting "never"), nothing is copied.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence
from pathlib import Path

import torch

HUGE_PAGE = 2 << 20
ALIGNMENT = 4096  # each tensor starts on a page of its own: cache-line aligned, and no two share a line
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def available() -> bool:
    """Whether copies would land in huge pages: asked for (GYM_HUGE_PAGES, default on), and the kernel grants
    them to a mapping that asks (its setting "always" or "madvise", not "never")."""
    if os.environ.get("GYM_HUGE_PAGES", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if not hasattr(mmap, "MADV_HUGEPAGE") or not hasattr(mmap, "MAP_PRIVATE"):
        return False
    try:
        setting = THP_SETTING.read_text()
    except OSError:
        return False
    return "[never]" not in setting


def _span(tensor: torch.Tensor) -> int:
    return (tensor.numel() * tensor.element_size() + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def copies(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor] | None:
    """Copies of `tensors` (CPU tensors) side by side in one private mapping advised for huge pages, each
    with its tensor's dtype and shape; None where huge pages are not available. The copies keep the mapping
    alive (torch.frombuffer holds it) and it is unmapped when the last of them goes."""
    if not available() or not tensors:
        return None
    total = sum(_span(tensor) for tensor in tensors)
    # MAP_PRIVATE | MAP_ANONYMOUS: a shared anonymous mapping is shared memory, which huge pages skip.
    arena = mmap.mmap(-1, total + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        arena.madvise(mmap.MADV_HUGEPAGE)
    except OSError:
        arena.close()
        return None
    memory = torch.frombuffer(arena, dtype=torch.uint8)
    offset = -memory.data_ptr() % HUGE_PAGE  # huge pages cover 2 MB-aligned ranges
    placed = []
    for tensor in tensors:
        size = tensor.numel() * tensor.element_size()
        copy = memory[offset:offset + size].view(tensor.dtype).view(tensor.shape)
        copy.copy_(tensor)
        placed.append(copy)
        offset += _span(tensor)
    return placed
