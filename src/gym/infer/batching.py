"""What the engines that schedule their own batches share (hf, fast, llamacpp, the vision engine): the waiting
queue, the engine thread's loop, shutdown, and the guarantee that every request hears how it ended.

A subclass says what a step is (`_step`), how waiting requests join (`_take_waiting`, under the lock),
whether it has work in flight (`_busy`) and which requests it holds (`_in_flight`); the rest is here.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from gym.infer.emit import finish
from gym.infer.grammar import Matcher
from gym.infer.requests import Event, Finished, Media, Request, SamplingParams, admit, refuse_media

logger = logging.getLogger(__name__)


class BatchingEngine(ABC):
    """The Engine protocol (gym.infer.requests) around a subclass's step. Up to `max_waiting` requests
    wait for a row; one more is refused with EngineBusy."""

    thread_name = "gym-engine"
    takes_media = False  # whether a request may carry media (gym.infer.vision_engine); text engines refuse them

    def __init__(self, tokenizer: Any, stop_token_ids: list[int], *, max_batch_size: int, max_waiting: int) -> None:
        self.tokenizer = tokenizer
        self.stop_token_ids = set(stop_token_ids)
        self.max_batch_size = max(1, max_batch_size)
        self.max_waiting = max_waiting
        self._waiting: deque[Request] = deque()
        self._lock = threading.Condition()
        self._running = True
        self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)

    def _start(self) -> None:
        """Called by the subclass once its own state exists."""
        self._thread.start()

    # -- the caller's side ----------------------------------------------------------------------
    def submit(self, prompt_ids: list[int], params: SamplingParams,
               sink: Callable[[Event], None] | None = None, media: Media | None = None) -> Request:
        if not self.takes_media:
            refuse_media(media)
        variant = self._variant(params.variant) if params.variant is not None else None
        # Built here, in the caller's thread and outside the lock: a grammar the tokenizer cannot serve is the
        # caller's ConfigError, and the first constrained request's tokenizer preparation (~0.3 s) holds up
        # no one else.
        matcher = (Matcher(params.constraint, self.tokenizer, self.stop_token_ids)
                   if params.constraint is not None else None)
        with self._lock:
            request = admit(prompt_ids, params, sink, running=self._running, queued=len(self._waiting),
                            limit=self.max_waiting, queued_as="already waiting", variant=variant, matcher=matcher,
                            media=media or None)
            self._waiting.append(request)
            self._lock.notify()
        return request

    def _variant(self, name: str) -> Any:
        """The compiled variant a request names; None where the engine serves no variants (admit refuses it)."""
        return None

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> Finished:
        """Blocking: the whole answer."""
        *_, last = self.submit(prompt_ids, params).events()
        assert isinstance(last, Finished)
        return last

    @property
    def load(self) -> dict[str, int]:
        return {"running": len(self._in_flight()), "waiting": len(self._waiting)}

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop taking requests, finish the step in flight, and tell everyone still waiting or running."""
        with self._lock:
            self._running = False
            self._lock.notify()
        self._thread.join(timeout)

    # -- the engine thread ----------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while True:
                with self._lock:
                    settle = self._wait_for_work()
                    if not self._running:
                        break
                    if not settle:
                        self._take_waiting()
                if settle:
                    self._settle()  # outside the lock: requests may arrive meanwhile, and wait for it
                    continue
                with torch.inference_mode():
                    self._step()
        except Exception as exc:  # a bug or an out-of-memory must not leave clients hanging
            logger.exception("The inference engine stopped: %s", exc)
        finally:
            with self._lock:
                self._running = False
                leftovers = list(self._waiting) + self._in_flight()
                self._waiting.clear()
            for request in leftovers:
                finish(request, "cancelled")
            self._reset()

    # Seconds the engine stands idle before it does its one-time work (_settle): long enough that a request
    # coming right after start-up (`gym chat --prompt`) is answered first.
    settle_after = 0.5

    def _wait_for_work(self) -> bool:
        """Under the lock: wait for a request or the shutdown. Returns True instead when the engine has one-time
        work (_unsettled) and has stood idle for settle_after seconds."""
        while self._running and not self._waiting and not self._busy():
            if not self._unsettled():
                self._lock.wait()
            elif not self._lock.wait(self.settle_after) and not self._waiting and self._running:
                return True
        return False

    def _unsettled(self) -> bool:
        """Whether one-time work waits for an idle moment (none by default)."""
        return False

    def _settle(self) -> None:
        """That one-time work, in the engine thread, outside the lock."""
        return None

    @abstractmethod
    def _busy(self) -> bool:
        """Whether any request is being prefilled or decoded."""

    @abstractmethod
    def _take_waiting(self) -> None:
        """Move waiting requests into the engine's own state (called under the lock)."""

    @abstractmethod
    def _step(self) -> None:
        """One step of work: prefill and/or decode, reporting tokens."""

    @abstractmethod
    def _in_flight(self) -> list[Request]:
        """The requests the engine holds (not the waiting ones)."""

    @abstractmethod
    def _reset(self) -> None:
        """Drop every request's state after the loop ends."""


class OneRequestEngine(BatchingEngine):
    """An engine that decodes one request at a time (llama.cpp, the vision model's generate): the rest wait in
    order. A subclass says what a step does with `_current`, the request it holds."""

    def __init__(self, tokenizer: Any, stop_token_ids: list[int], *, max_waiting: int) -> None:
        super().__init__(tokenizer, stop_token_ids, max_batch_size=1, max_waiting=max_waiting)
        self._current: Request | None = None

    def _busy(self) -> bool:
        return self._current is not None

    def _in_flight(self) -> list[Request]:
        return [self._current] if self._current is not None else []

    def _take_waiting(self) -> None:
        if self._current is None and self._waiting:
            self._current = self._waiting.popleft()

    def _reset(self) -> None:
        self._current = None
