"""Python's full collections wait while a command starts.

A command's start imports torch, transformers and the rest and reads a model: hundreds of thousands of objects
that live as long as the process. CPython runs a full collection each time its long-lived objects have grown by a
quarter since the last one, and each walks all of them: ten walks during `gym train`'s start (1.7 of its ~7 s),
and 0.2 s of `gym chat --prompt`'s 2.0 (docs/benchmarks.md). Garbage is not what a start makes, so those walks
find next to nothing.

`deferred_full_collections()` holds full collections back for a command (young objects are collected as always)
and puts the collector back as it was when the command returns. Work that runs long (a training loop, a server)
calls `work_begins()` first, so a run of hours or a server of days collects as CPython always does; the first full
collection then walks everything once, where the start would have walked it ten times. CPython 3.14's incremental
collector has no such walks to hold back, and there the block changes nothing.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

# The oldest generation is collected after this many collections of the middle one: with it, never in practice.
_HELD_BACK = 2**30

_saved_thresholds: tuple[int, int, int] | None = None


@contextmanager
def deferred_full_collections() -> Iterator[None]:
    """Full collections wait until `work_begins()` or the end of the block. Nested blocks (a command that runs
    another in-process) leave the outer one in charge."""
    global _saved_thresholds
    if _saved_thresholds is not None:
        yield
        return
    thresholds = gc.get_threshold()
    young, middle = thresholds[0], thresholds[1]
    gc.set_threshold(young, middle, _HELD_BACK)
    if gc.get_threshold()[2] != _HELD_BACK:
        # CPython 3.14's incremental collector has no oldest-generation threshold (it ignores the third value and
        # walks the old objects a slice at a time, no start-up walks to hold back): nothing to do.
        gc.set_threshold(*thresholds)
        yield
        return
    _saved_thresholds = (young, middle, thresholds[2])
    try:
        yield
    finally:
        work_begins()


def work_begins() -> None:
    """The start is over: collect as CPython does from here on (a no-op outside `deferred_full_collections`)."""
    global _saved_thresholds
    if _saved_thresholds is not None:
        gc.set_threshold(*_saved_thresholds)
        _saved_thresholds = None
