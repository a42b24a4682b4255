"""Full collections wait while a command starts, and come back when its work begins or it returns."""

from __future__ import annotations

import gc
import sys

import pytest
from tests.gym_cli import gym_here
from transformers import TrainerCallback

from gym.core.heap import deferred_full_collections, work_begins

# CPython 3.14's incremental collector has no oldest-generation threshold; there the block changes nothing.
GENERATIONAL = sys.version_info < (3, 14)


class Collections:
    """Counts the collector's full (oldest-generation) collections while it is installed."""

    def __init__(self) -> None:
        self.full = 0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 2:
            self.full += 1

    def __enter__(self) -> Collections:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


def grow_the_heap(objects: int = 300_000) -> list:
    """What an import does, as the collector sees it: many small containers that all stay alive."""
    return [[i] for i in range(objects)]


@pytest.mark.skipif(not GENERATIONAL, reason="CPython 3.14 collects the old generation incrementally")
def test_a_start_growing_the_heap_runs_no_full_collection_until_its_work_begins():
    kept = []
    gc.collect()
    with Collections() as outside:
        kept.append(grow_the_heap())
    assert outside.full > 0  # the collector's own rule walks a growing heap again and again

    before = gc.get_threshold()
    gc.collect()
    with deferred_full_collections(), Collections() as started:
        kept.append(grow_the_heap())
        assert started.full == 0
        work_begins()
        assert gc.get_threshold() == before
        kept.append(grow_the_heap())
        assert started.full > 0  # collecting as before once the work began
    assert gc.get_threshold() == before


def test_the_collector_is_put_back_after_an_error_and_an_inner_block_leaves_the_outer_in_charge():
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), deferred_full_collections():
        assert gc.get_threshold()[:2] == before[:2]
        assert gc.get_threshold()[2] > before[2] or not GENERATIONAL
        raise RuntimeError
    assert gc.get_threshold() == before

    with deferred_full_collections():
        held = gc.get_threshold()
        with deferred_full_collections():
            pass
        assert gc.get_threshold() == held  # the inner block ending is not the start's end
    assert gc.get_threshold() == before
    work_begins()  # outside any block: nothing to do
    assert gc.get_threshold() == before


def test_a_training_loop_runs_with_the_collector_as_cpython_has_it(train_config):
    from gym.train.harness import extra_callbacks
    from gym.workflows.training import run_exp

    class Thresholds(TrainerCallback):
        seen: list[tuple[int, int, int]] = []

        def on_step_end(self, args, state, control, **kwargs):
            self.seen.append(gc.get_threshold())

    before = gc.get_threshold()
    with deferred_full_collections(), extra_callbacks(Thresholds()):
        assert gc.get_threshold() != before or not GENERATIONAL
        run_exp(train_config(max_steps=2))
    assert Thresholds.seen == [before, before]


def test_a_command_puts_the_collector_back_when_it_returns_or_fails(capfd, tmp_path):
    before = gc.get_threshold()
    assert gym_here("version", capfd=capfd).returncode == 0
    assert gc.get_threshold() == before
    assert gym_here("train", str(tmp_path / "missing.yaml"), capfd=capfd).returncode == 2
    assert gc.get_threshold() == before


def test_on_a_collector_without_an_oldest_threshold_the_block_changes_nothing(monkeypatch):
    """What CPython 3.14's incremental collector does with a third threshold: ignores it."""
    import gym.core.heap as heap

    class Incremental:
        thresholds = (2000, 10, 0)

        def get_threshold(self):
            return self.thresholds

        def set_threshold(self, young, middle=10, *ignored):
            self.thresholds = (young, middle, 0)

    collector = Incremental()
    monkeypatch.setattr(heap, "gc", collector)
    with deferred_full_collections():
        assert collector.thresholds == (2000, 10, 0)
        work_begins()
    assert collector.thresholds == (2000, 10, 0) and heap._saved_thresholds is None
