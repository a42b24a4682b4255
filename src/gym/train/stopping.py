"""Stopping a run on request without losing it: the first Ctrl-C (SIGINT, which is also what the web UI's
Stop sends) lets the current step finish, saves a checkpoint and ends the run with `RunStopped`;
`resume_from_checkpoint: true` continues from there. A second Ctrl-C interrupts at once, as usual.

Only the main thread can own a signal handler; a run started from another thread (a test, a notebook
worker) keeps Python's default behaviour.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from transformers import TrainerCallback

from gym.core.errors import RunStopped
from gym.train import ranks

logger = logging.getLogger(__name__)


class StopRequest:
    """Set by the first SIGINT; the training loop polls it between steps."""

    def __init__(self) -> None:
        self.requested = False

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        logger.warning("Stop requested: saving a checkpoint after this step (Ctrl-C again to quit at once).")


@contextmanager
def stop_on_interrupt() -> Iterator[StopRequest]:
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    previous = signal.signal(signal.SIGINT, request.handle)
    try:
        yield request
    finally:
        signal.signal(signal.SIGINT, previous)


class StopCallback(TrainerCallback):
    """Turns a stop request into the Trainer's own save-then-stop at the end of the current step."""

    def __init__(self, request: StopRequest) -> None:
        self.request = request

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Under torchrun every rank must stop after the same step: one that stopped while another went on into
        # the next step's gradient exchange would leave that one waiting for it until the process group times
        # out. The signal reaches each rank at its own moment, so the ranks decide together.
        if ranks.any_across(self.request.requested):
            self.request.requested = True
            control.should_save = True
            control.should_training_stop = True


class NothingLeftToTrain(Exception):
    """Raised from on_train_begin when the resumed checkpoint is already at the run's last step."""


class EndReachedCallback(TrainerCallback):
    """Resuming a checkpoint saved at the run's last step (a run killed while saving its result): the Trainer would
    still start its epoch loop and train one step past max_steps before its end-of-step check. Here the checkpoint
    is loaded (weights, and under FSDP or DeepSpeed their shards) and nothing trains; the caller saves the result."""

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if 0 < state.max_steps <= state.global_step:
            raise NothingLeftToTrain


def stopped(output_dir: str, step: int, max_steps: int) -> RunStopped:
    checkpoint = Path(output_dir) / f"checkpoint-{step}"
    return RunStopped(f"stopped at step {step} of {max_steps} on request; the checkpoint is {checkpoint}. "
                      "Continue with resume_from_checkpoint=true.")
