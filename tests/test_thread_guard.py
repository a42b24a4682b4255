"""The suite's guard against threads a test leaves burning CPU (tests/thread_guard.py): it measures a thread that
spins, names it and shows where it is, and leaves one that sleeps alone."""

from __future__ import annotations

import sys
import threading
import time

import pytest
from tests.thread_guard import MIN_SECONDS, MIN_SHARE, describe, spinning, thread_cpu

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task")


def _spin(stop: threading.Event) -> None:
    while not stop.is_set():
        pass


def test_a_spinning_thread_is_found_and_named_and_a_sleeping_one_is_not():
    stop = threading.Event()
    spinner = threading.Thread(target=_spin, args=(stop,), name="left-spinning", daemon=True)
    sleeper = threading.Thread(target=stop.wait, name="left-waiting", daemon=True)
    spinner.start()
    sleeper.start()
    try:
        # On a loaded machine (the suite's other worker, a build) a window can give the spinner too little CPU to
        # be over the bar, and then the guard is right to say nothing: measure windows until one where it was.
        for _ in range(8):
            before, started = thread_cpu(), time.monotonic()
            time.sleep(2.5)  # the main thread idles, as pytest does between a module's tests
            after, wall = thread_cpu(), time.monotonic() - started
            used = after[spinner.native_id] - before[spinner.native_id]
            found = spinning(before, after, wall, among={spinner.native_id, sleeper.native_id})
            assert sleeper.native_id not in found
            if used >= MIN_SECONDS and used > MIN_SHARE * wall:
                break
        else:
            pytest.fail("the spinning thread never got its CPU in 8 windows: the machine is overloaded")
        assert list(found) == [spinner.native_id] and found[spinner.native_id] == used
        message = describe(spinner.native_id, found[spinner.native_id], wall)
        assert "'left-spinning'" in message and "_spin" in message
    finally:
        stop.set()
        spinner.join()
        sleeper.join()


def test_the_bar_is_on_the_threads_together_and_born_ones_do_not_count():
    before = {1: 0.0, 2: 0.0, 3: 5.0}
    after = {1: 1.5, 2: 3.0, 3: 5.0, 4: 9.0}  # 4 was born in the module: its own work
    assert spinning(before, after, 10.0, among={1, 2, 3, 4}) == {}  # 4.5 s in 10: under half
    assert spinning(before, after, 8.0, among={1, 2, 3, 4}) == {2: 3.0, 1: 1.5}  # 4.5 s in 8, each under half
    assert spinning(before, after, 1.0, among={1}) == {}  # under 2 s
