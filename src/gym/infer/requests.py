"""What every engine shares: a request's sampling settings, the events it reports, and its handle.

An engine takes prompt token ids and `SamplingParams` (`submit`) and reports `Piece` events (text as
it is produced) and one `Finished` event, either to a callback or to the request's own queue.
"""

from __future__ import annotations

import itertools
import queue
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from gym.config.generating import DECODING_DEFAULTS
from gym.core.errors import ConfigError, GymError
from gym.infer.grammar import Constraint, Matcher
from gym.infer.stops import StopFilter


class EngineBusy(GymError):
    """The waiting queue is full: the caller should retry later (HTTP 429)."""


class EngineStopped(GymError):
    """The engine was shut down before the request finished."""


@dataclass
class SamplingParams:
    """One request's decoding settings; the defaults are Gym's (gym.config.generating), which a ChatModel
    replaces with the model's generation_config and the user's keys."""

    max_new_tokens: int = DECODING_DEFAULTS["max_new_tokens"]
    do_sample: bool = DECODING_DEFAULTS["do_sample"]
    temperature: float = DECODING_DEFAULTS["temperature"]
    top_p: float = DECODING_DEFAULTS["top_p"]
    top_k: int = DECODING_DEFAULTS["top_k"]
    repetition_penalty: float = DECODING_DEFAULTS["repetition_penalty"]
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    variant: str | None = None
    """The per-user variant of the base that answers (an engine serving variants; None: the base)."""
    constraint: Constraint | None = None
    """What the answer must match (gym.infer.grammar: a JSON schema, any JSON object, a lark grammar); None: any
    text."""

    def __post_init__(self) -> None:
        # Checked here, in the caller's thread: a string temperature reaching the engine's thread stopped the engine
        # for every request, and the caller waited for an answer that never came.
        def number(name: str, low: float, high: float | None = None, *, whole: bool = False,
                   above: bool = False) -> None:
            value = getattr(self, name)
            kinds: tuple[type, ...] = (int,) if whole else (int, float)
            wrong = isinstance(value, bool) or not isinstance(value, kinds)
            if wrong or value < low or (above and value == low) or (high is not None and value > high):
                limit = f"{'above' if above else 'at least'} {low:g}" + (f" and at most {high:g}" if high else "")
                raise ConfigError(f"{name} must be a{' whole' if whole else ''} number {limit}, got {value!r}.")

        number("max_new_tokens", 1, whole=True)
        number("temperature", 0)
        number("top_p", 0, 1, above=True)
        number("top_k", 0, whole=True)
        number("repetition_penalty", 0, above=True)
        if not isinstance(self.do_sample, bool):
            raise ConfigError(f"do_sample must be true or false, got {self.do_sample!r}.")
        if not isinstance(self.stop, list) or not all(isinstance(s, str) for s in self.stop):
            raise ConfigError(f"stop must be a string or a list of strings, got {self.stop!r}.")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ConfigError(f"seed must be a whole number, got {self.seed!r}.")

    @property
    def greedy(self) -> bool:
        return not self.do_sample or self.temperature <= 0


@dataclass
class Piece:
    """Text produced by one step (possibly empty while a stop string or a multi-byte character is held back)."""
    text: str
    token_ids: list[int]


@dataclass
class Finished:
    reason: str  # "stop" (end-of-turn token or stop string), "length", "cancelled", "error" (see `error`)
    prompt_tokens: int
    completion_tokens: int
    text: str
    # Why a constrained answer was cut short ("error"): the grammar library could not go on, so `text` need not
    # match the grammar; reported as an error, never as a finished answer (gym.infer.grammar.GrammarStopped).
    error: str = ""


Event = Piece | Finished

Media = dict[str, torch.Tensor]
"""A multimodal prompt's media, as the model's processor made them (`pixel_values`, `image_sizes`, ...), beside
prompt ids in which each image is already expanded into its image tokens."""


def refuse_media(media: Media | None) -> None:
    """Engines for text models say so to a request that carries media, rather than answer without them."""
    if media:
        raise ConfigError("This engine serves text models only; a request with images needs a vision-language model, "
                          "which Gym serves with infer_backend: hf (or auto).")


class Request:
    """One generation: fed by the engine thread, read by the caller through `events` or a callback."""

    _ids = itertools.count()

    def __init__(self, prompt_ids: list[int], params: SamplingParams,
                 sink: Callable[[Event], None] | None = None, media: Media | None = None) -> None:
        self.id = next(self._ids)
        self.prompt_ids = list(prompt_ids)
        self.params = params
        self.media = media  # the processor's tensors for the prompt's image tokens (gym.infer.vision_engine)
        self.generated: list[int] = []
        self.text = ""  # emitted so far
        self.cancelled = False
        self.variant: Any = None  # the engine's compiled form of params.variant, fixed for the request's life
        self.matcher: Matcher | None = None  # where the answer stands in params.constraint's grammar
        self.arrived = time.perf_counter()
        seed = params.seed if params.seed is not None else random.getrandbits(63)
        self.generator = torch.Generator().manual_seed(seed)
        self.stop_filter = StopFilter(params.stop)
        self.detok_offsets = (0, 0)  # the window of `generated` that incremental detokenizing decodes (gym.infer.emit)
        self._events: queue.Queue[Event] | None = None
        self._sink = sink
        if sink is None:
            self._events = queue.Queue()

    def emit(self, event: Event) -> None:
        if self._sink is not None:
            self._sink(event)
        else:
            assert self._events is not None
            self._events.put(event)

    def events(self, timeout: float | None = None) -> Iterator[Event]:
        assert self._events is not None, "this request reports to a callback"
        while True:
            event = self._events.get(timeout=timeout)
            yield event
            if isinstance(event, Finished):
                return

    def cancel(self) -> None:
        self.cancelled = True


def admit(prompt_ids: list[int], params: SamplingParams, sink: Callable[[Event], None] | None, *, running: bool,
          queued: int, limit: int, queued_as: str, variant: Any = None, matcher: Matcher | None = None,
          media: Media | None = None) -> Request:
    """A new Request, if the engine takes it: not after shutdown (EngineStopped), not past `limit` requests
    already `queued_as` (EngineBusy, HTTP 429). `matcher`: the engine's matcher for params.constraint (an
    engine that gives none does not constrain decoding, and a constrained request is refused rather than
    answered unconstrained). Call it under the engine's lock."""
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    if params.variant is not None and variant is None:
        raise ValueError(f"This engine serves the base model only; variant {params.variant!r} needs the fast engine "
                         "with variants (gym api --variants STORE).")
    if params.constraint is not None and matcher is None:
        raise ConfigError(f"This engine cannot constrain decoding ({params.constraint.kind.value}); structured "
                          "outputs run on the fast, transformers (hf) and llama.cpp engines (infer_backend).")
    if not running:
        raise EngineStopped("the engine is shutting down")
    if queued >= limit:
        raise EngineBusy(f"{queued} requests are {queued_as}; retry later")
    request = Request(prompt_ids, params, sink, media)
    request.variant = variant
    request.matcher = matcher
    return request


class Engine(Protocol):
    """The interface of every inference engine (gym.infer.hf_engine, gym.infer.vllm_engine)."""

    def submit(self, prompt_ids: list[int], params: SamplingParams,
               sink: Callable[[Event], None] | None = None, media: Media | None = None) -> Request:
        """`media`: a multimodal prompt's tensors; only an engine serving a vision-language model takes them
        (the others raise ConfigError, gym.infer.requests.refuse_media)."""

    @property
    def load(self) -> dict[str, int]: ...

    def shutdown(self, timeout: float = 30.0) -> None: ...
