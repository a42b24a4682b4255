"""A training run's freed memory stays in the process for its next step, and what is free is given back at its end.

Each case runs in a process of its own: the settings are process-wide, and this worker set them at its start
(tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

GLIBC = (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc") if hasattr(os, "confstr") else False
pytestmark = pytest.mark.skipif(not GLIBC, reason="malloc's thresholds are glibc's")

# A step's shape: a block above glibc's largest automatic mmap threshold (32 MB), one below it and a small one,
# each written and freed, ten times over after a first step that maps its pages in any case.
PROBE = r"""
import ctypes, json, resource
from gym.core.allocator import keep_freed_memory, release_free_memory

kept = keep_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
SIZES = (48 << 20, 6 << 20, 1 << 20)

def step():
    blocks = [libc.malloc(size) for size in SIZES]
    for block, size in zip(blocks, SIZES):
        ctypes.memset(block, 1, size)
    for block in blocks:
        libc.free(block)

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

def resident():
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * resource.getpagesize()

start = resident()
step()
before = faults()
for _ in range(10):
    step()
stepping = faults() - before
held = resident() - start
release_free_memory()
print(json.dumps({"kept": kept, "faults": stepping, "held": held, "released": resident() - start}))
"""


def probe(keep: str | None) -> dict:
    env = dict(os.environ)
    env.pop("GYM_KEEP_FREED_MEMORY", None)
    if keep is not None:
        env["GYM_KEEP_FREED_MEMORY"] = keep
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def default() -> dict:
    return probe("0")


@pytest.fixture(scope="module")
def kept() -> dict:
    return probe(None)


def test_freed_blocks_are_reused_without_faulting_their_pages_in_again(default, kept):
    assert not default["kept"] and kept["kept"]
    # as glibc is: the 48 MB block is mapped anew each step and each of its 12,288 pages faults in again
    assert default["faults"] > 10 * 10_000, default
    assert kept["faults"] < default["faults"] / 20, (kept, default)


def test_what_is_free_is_kept_while_stepping_and_given_back_at_the_end(default, kept):
    assert default["held"] < 20 << 20, default  # glibc unmapped the 48 MB block at each free
    assert kept["held"] > 48 << 20, kept  # freed, but kept for the next step
    assert kept["released"] < 10 << 20, kept
