"""A training run keeps the memory it frees for its next step, instead of handing it to the kernel and faulting it
back in, page by page, a moment later.

glibc's malloc serves a block above its mmap threshold (128 KB at first, raised as such blocks are freed, to at most
32 MB) with a mapping of its own and unmaps it on free, and gives the top of its heap back once more than twice that
is free there. A training step allocates and frees the same activations, logits and gradients every step, so each
step maps them again and the kernel faults in and zeroes every 4 KB page anew. With both thresholds at their
maximum, the quick start's `gym train` made 57-59% fewer page faults and spent 38-41% less system CPU, at the same
step time (its steps are mostly arithmetic), and the suite's training and safety tests, in fresh workers, made 59%
fewer and spent 43% less; the whole suite's did not change (bench/train_malloc.py, docs/benchmarks.md). PyTorch's
own CPU launcher (`torch.backends.xeon.run_cpu`) goes further the same way: it preloads tcmalloc or jemalloc, which
keep freed memory in the process.

The cost is that a process's resident memory stays near its peak while it trains, which the run reached anyway.
`freed_memory_kept()` gives back what is free when the run ends (malloc_trim), so a server's job worker, or a
notebook that goes on after `run_exp`, does not hold a finished run's peak. The thresholds stay: with them fixed,
glibc no longer adjusts them, and the old ones fixed would fault more than ever.

GYM_KEEP_FREED_MEMORY=0 leaves malloc as it is. Other C libraries (musl, macOS), or jemalloc/tcmalloc preloaded
(whose memory glibc's settings do not govern), are left alone or unaffected.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1  # glibc's <malloc.h>
_M_MMAP_THRESHOLD = -3
_LARGEST = 2**31 - 1  # mallopt takes an int
_OLD_GLIBC_LARGEST_MMAP = 32 << 20  # older glibc refuses an mmap threshold above half a heap (64 MB on 64-bit)

_kept = False


def _wanted() -> bool:
    return os.environ.get("GYM_KEEP_FREED_MEMORY", "1").strip().lower() not in ("0", "false", "no", "off")


@cache
def _glibc() -> ctypes.CDLL | None:
    try:
        version = os.confstr("CS_GNU_LIBC_VERSION")
    except (AttributeError, ValueError, OSError):  # not a POSIX system, or no such name
        return None
    if not version or not version.startswith("glibc"):
        return None
    try:
        return ctypes.CDLL(None)  # the process's own symbols: glibc's, or a preloaded allocator's
    except OSError:
        return None


def keep_freed_memory() -> bool:
    """Set glibc's thresholds so that freed blocks stay in the process for reuse; True when they are set (now or
    before). Process-wide and idempotent."""
    global _kept
    if _kept:
        return True
    libc = _glibc()
    if libc is None or not _wanted():
        return False
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    mapped = mallopt(_M_MMAP_THRESHOLD, _LARGEST) or mallopt(_M_MMAP_THRESHOLD, _OLD_GLIBC_LARGEST_MMAP)
    trimmed = mallopt(_M_TRIM_THRESHOLD, _LARGEST)
    _kept = bool(mapped and trimmed)
    if not _kept:
        logger.debug("malloc's thresholds were not set (mallopt refused them)")
    return _kept


def release_free_memory() -> None:
    """Hand what malloc holds free back to the kernel (glibc's malloc_trim); nothing elsewhere."""
    libc = _glibc()
    if libc is not None and _kept:
        libc.malloc_trim(ctypes.c_size_t(0))


@contextmanager
def freed_memory_kept() -> Iterator[None]:
    """Freed memory is kept for reuse inside the block, and what is free at its end is given back."""
    keep_freed_memory()
    try:
        yield
    finally:
        release_free_memory()
