"""A pytest plugin: no test may leave a thread that keeps burning CPU after its module has ended.

A pytest worker runs a third of the suite after any given module, so a thread left spinning (a test server's
handler looping on `recv() == b""` once its client hung up did) takes a core and the GIL from every later test on
that worker: it cost the suite 16:00 -> 13:10 and ~180 s of system time on 2 cores before it was found. Each
module's last test fails its teardown when the Python threads that were alive before the module began used,
together, more CPU than half the module's wall time (and at least 2 s); the message names them and where they are.
Linux only (/proc).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from pathlib import Path

import pytest

TASKS = Path("/proc/self/task")
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
MIN_SECONDS, MIN_SHARE = 2.0, 0.5


def thread_cpu() -> dict[int, float]:
    """CPU seconds (user + system) of each thread of this process, by native id."""
    seconds: dict[int, float] = {}
    for task in TASKS.iterdir() if TASKS.is_dir() else ():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended between the listing and the read
            continue
        seconds[int(task.name)] = (int(fields[11]) + int(fields[12])) / _TICKS
    return seconds


def spinning(before: dict[int, float], after: dict[int, float], wall: float, *, among: set[int]) -> dict[int, float]:
    """Threads of `among` alive in `before` that together used more than MIN_SHARE of `wall` and at least
    MIN_SECONDS of CPU by `after` (8 threads spinning share the GIL, each below the bar): those that used any,
    native id -> seconds, the most first; {} when together they stayed under the bar."""
    used = {tid: after[tid] - before[tid] for tid in before.keys() & after.keys() & among}
    total = sum(used.values())
    if total < MIN_SECONDS or total <= MIN_SHARE * wall:
        return {}
    return dict(sorted(((tid, s) for tid, s in used.items() if s > 0), key=lambda item: -item[1]))


def describe(tid: int, seconds: float, wall: float) -> str:
    thread = next((t for t in threading.enumerate() if t.native_id == tid), None)
    frame = sys._current_frames().get(thread.ident) if thread is not None and thread.ident is not None else None
    where = "".join(traceback.format_stack(frame, limit=4)) if frame is not None else "  (not a Python thread)\n"
    name = thread.name if thread is not None else (TASKS / str(tid) / "comm").read_text().strip()
    return f"thread {name!r} used {seconds:.1f} s of CPU in {wall:.1f} s, at:\n{where}"


class ModuleWatch:
    def __init__(self) -> None:
        self.module: object = None
        self.started = 0.0
        self.before: dict[int, float] = {}

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        module = getattr(item, "module", None)
        if module is not self.module:
            self.module, self.started, self.before = module, time.monotonic(), thread_cpu()

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None) -> None:
        if nextitem is not None and getattr(nextitem, "module", None) is self.module:
            return
        wall = time.monotonic() - self.started
        # Python threads only, the main one aside: torch's OpenMP pool (native, made by an earlier module's first
        # product) computes for every later module when one process runs the suite (PYTEST_WORKERS=0).
        main = threading.main_thread()
        python = {t.native_id for t in threading.enumerate() if t is not main and t.native_id is not None}
        found = spinning(self.before, thread_cpu(), wall, among=python)
        if found:
            pytest.fail("A thread left by an earlier test kept burning CPU through this module (every later test "
                        "on this worker pays for it):\n" + "\n".join(describe(t, s, wall) for t, s in found.items()),
                        pytrace=False)


def pytest_configure(config: pytest.Config) -> None:
    if TASKS.is_dir():
        config.pluginmanager.register(ModuleWatch(), "gym-thread-guard")
