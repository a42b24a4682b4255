"""The models Training-Free GRPO talks to: a Gym model on the local engine, or any OpenAI-compatible endpoint.

Both answer `complete(messages, temperature=, max_tokens=, seed=)` with a `Completion` (text and token
counts), and are safe to call from many threads at once: the local engine batches concurrent requests
into shared forward passes; the endpoint client sends them in parallel. `OpenAIEndpoint` retries 429,
5xx, timeouts and dropped connections with exponential backoff (`retry_delay` * 2^attempt, at most
`max_retry_delay`), honouring a server's Retry-After up to that cap.

`CallCache` records every answer by its request (model, messages, temperature, max_tokens, seed) in a
JSON-lines file: a run that is resumed or replayed gets the same answers without calling again, so its
library is identical even when the endpoint samples differently each time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import logging
import math
import os
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from gym.core.errors import ConfigError, GymError

if TYPE_CHECKING:
    from gym.infer.chat import ChatModel

logger = logging.getLogger(__name__)
# How long close() waits for the tasks left on an endpoint's loop once its calls are cancelled (each ends in
# milliseconds, closing its connection) before it cancels them too.
_CLOSE_GRACE = 5.0

Message = dict[str, str]


@dataclass(frozen=True)
class Completion:
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached: bool = False


@runtime_checkable
class LLM(Protocol):
    """Anything that answers a conversation: the local engine, an endpoint, or a test's scripted model."""

    name: str

    def complete(self, messages: list[Message], *, temperature: float, max_tokens: int,
                 seed: int | None = None) -> Completion: ...


class LLMUnavailable(GymError):
    """The endpoint kept failing after every retry, or refused the request outright."""


# ---------------------------------------------------------------- the local engine

class LocalLLM:
    """A Gym model (base, adapter, variant folder) answering through its inference engine, with its chat template."""

    def __init__(self, chat_model: ChatModel, name: str | None = None) -> None:
        self.chat_model = chat_model
        self.name = name or str(chat_model.model_args.model_name_or_path)

    @classmethod
    def load(cls, config: dict[str, Any], max_batch_size: int = 16) -> LocalLLM:
        from gym.infer.chat import ChatModel

        return cls(ChatModel(config, max_batch_size=max_batch_size, max_waiting=max(256, 4 * max_batch_size)))

    def complete(self, messages: list[Message], *, temperature: float, max_tokens: int,
                 seed: int | None = None) -> Completion:
        from gym.infer.requests import Finished

        system = next((m["content"] for m in messages if m["role"] == "system"), None)
        turns = [m for m in messages if m["role"] != "system"]
        prompt = self.chat_model.render(turns, system)
        params = self.chat_model.sampling_params(temperature=temperature, do_sample=temperature > 0,
                                                 max_new_tokens=max_tokens, seed=seed)
        *_, last = self.chat_model.engine.submit(prompt, params).events()
        assert isinstance(last, Finished)
        return Completion(last.text, last.prompt_tokens, last.completion_tokens)

    def close(self) -> None:
        self.chat_model.close()


# ---------------------------------------------------------------- an OpenAI-compatible endpoint

class OpenAIEndpoint:
    """`base_url` + `model` (+ `api_key`, else $OPENAI_API_KEY): OpenAI, vLLM, llama-server, `gym api`, ...

    `timeout` is a deadline for each call, from sending the request to the last byte of the answer. The HTTP
    client's own timeout only bounds each read, so a server that sends a byte a second would never trip it
    (issue #39); here the calls run on an event loop of the endpoint's own (a thread) under asyncio's wait_for,
    which cancels a call at its deadline and so closes its connection, whatever the HTTP library underneath."""

    def __init__(self, base_url: str, model: str, api_key: str | None = None, *, timeout: float = 600.0,
                 max_retries: int = 6, retry_delay: float = 1.0, max_retry_delay: float = 60.0) -> None:
        try:
            import openai
        except ImportError:
            raise ConfigError("An OpenAI-compatible endpoint needs the openai client: pip install 'zoo-gym[serve]'.") \
                from None
        if not timeout > 0 or not math.isfinite(timeout):
            raise ConfigError(f"An endpoint's timeout must be a number of seconds above 0, got {timeout}.")
        if not all(0 <= d < math.inf for d in (retry_delay, max_retry_delay)):
            raise ConfigError(f"An endpoint's retry delays must be numbers of seconds >= 0, got {retry_delay} and "
                              f"{max_retry_delay}.")
        self.name = model
        self.base_url = base_url
        self.timeout = timeout
        self.max_retries, self.retry_delay, self.max_retry_delay = max_retries, retry_delay, max_retry_delay
        # Our own retry loop (below) instead of the client's, so that the backoff is set here and logged.
        self.client = openai.AsyncOpenAI(base_url=base_url, timeout=timeout, max_retries=0,
                                         api_key=api_key or os.environ.get("OPENAI_API_KEY") or "none")
        self._openai = openai
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"endpoint {base_url}", daemon=True)
        self._thread.start()
        # An endpoint dropped without close() (the Python API) still stops its thread when it is collected.
        self._finalizer = weakref.finalize(self, self._loop.call_soon_threadsafe, self._loop.stop)
        self._closed = threading.Event()
        self._submit_lock = threading.Lock()  # nothing is put on the loop once close() has begun
        self._in_flight: set[concurrent.futures.Future[bytes]] = set()

    def complete(self, messages: list[Message], *, temperature: float, max_tokens: int,
                 seed: int | None = None) -> Completion:
        openai = self._openai
        for attempt in range(self.max_retries + 1):
            try:
                body = self._call(model=self.name, messages=messages, temperature=temperature,
                                  max_tokens=max_tokens, seed=seed)
                break
            except (openai.RateLimitError, openai.InternalServerError, openai.APITimeoutError,
                    openai.APIConnectionError, TimeoutError) as exc:
                if attempt == self.max_retries:
                    raise LLMUnavailable(f"{self.base_url} ({self.name}) failed {attempt + 1} times; last: "
                                         f"{self._describe(exc)}") from None
                delay = self._delay(attempt, exc)
                logger.warning("%s: %s; retrying in %.2f s (%d/%d)", self.base_url, self._describe(exc), delay,
                               attempt + 1, self.max_retries)
                if self._closed.wait(delay):
                    raise LLMUnavailable(f"{self.base_url} ({self.name}): closed while waiting to retry.") from None
            except openai.APIStatusError as exc:  # 400/401/404...: retrying cannot help
                raise LLMUnavailable(f"{self.base_url} refused the request ({self.name}): "
                                     f"{self._describe(exc)}{self._reason(exc)}") from None
        try:
            return completion_from(body)
        except ValueError as exc:  # the same server would answer the same way: not retried
            raise LLMUnavailable(f"{self.base_url} ({self.name}) answered with something that is not a chat "
                                 f"completion: {exc}.") from None

    def _call(self, **request: Any) -> bytes:
        """One request, over by `timeout` (TimeoutError), on the endpoint's event loop; the answer's body."""
        async def call() -> bytes:
            raw = await self.client.chat.completions.with_raw_response.create(**request)
            return raw.http_response.content

        async def within_deadline() -> bytes:
            return await asyncio.wait_for(call(), self.timeout)

        with self._submit_lock:
            if self._closed.is_set():
                raise LLMUnavailable(f"{self.base_url} ({self.name}): the endpoint was closed.")
            future = asyncio.run_coroutine_threadsafe(within_deadline(), self._loop)
            self._in_flight.add(future)
        future.add_done_callback(self._in_flight.discard)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise LLMUnavailable(f"{self.base_url} ({self.name}): the call was abandoned, the endpoint was "
                                 "closed.") from None

    def _delay(self, attempt: int, exc: Exception) -> float:
        delay = min(self.retry_delay * 2 ** attempt, self.max_retry_delay)
        headers = getattr(getattr(exc, "response", None), "headers", None) or {}
        try:
            asked = float(headers.get("retry-after", ""))
        except ValueError:
            return delay
        if not math.isfinite(asked):  # "nan", "inf": not a number of seconds to wait
            return delay
        return min(max(asked, 0.0), self.max_retry_delay)

    def _describe(self, exc: Exception) -> str:
        if isinstance(exc, (TimeoutError, self._openai.APITimeoutError)):
            return f"no complete answer within the {self.timeout:g} s timeout"
        status = getattr(exc, "status_code", None)
        return f"HTTP {status}" if status else type(exc).__name__

    @staticmethod
    def _reason(exc: Exception) -> str:
        """The server's own words on a refusal, from OpenAI's error shape ({"error": {"message": ...}}, which openai
        unwraps to `body`): "max_tokens exceeds the context", "no such model". The status alone does not say."""
        body = getattr(exc, "body", None)
        message = body.get("message") if isinstance(body, dict) else body
        if not isinstance(message, str) or not message.strip():
            return ""
        message = " ".join(message.split())
        return f" ({message[:300]}{'...' if len(message) > 300 else ''})"

    def close(self) -> None:
        """Abandon the calls in flight (after one failed, the others are not waited for) and stop the loop."""
        with self._submit_lock:
            if self._closed.is_set():
                return
            self._closed.set()  # also ends a retry's wait
            self._finalizer.detach()
            calls = list(self._in_flight)
        # Only our own calls are cancelled, each through its future (its task is cancelled on the loop, before
        # shutdown() runs). The tasks the HTTP library spawned under them end with them: cancelling those too
        # could catch one before its first step, and anyio's task wrapper would then drop the coroutine it
        # wraps un-awaited, a RuntimeWarning at exit and, after the interpreter's teardown had begun, a
        # traceback on stderr.
        for call in calls:
            call.cancel()

        async def shutdown() -> None:
            others = {task for task in asyncio.all_tasks() if task is not asyncio.current_task()}
            if others:
                _, stuck = await asyncio.wait(others, timeout=_CLOSE_GRACE)
                for task in stuck:  # not ours, and not ended with ours: the loop is about to stop
                    task.cancel()
                if stuck:
                    await asyncio.wait(stuck, timeout=_CLOSE_GRACE)
            await self.client.close()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


def completion_from(body: bytes) -> Completion:
    """A chat completion's text and token counts from its JSON body; ValueError saying what is wrong with it.
    (The openai client builds its objects without checking them: `choices: "x"` would fail far from here.)"""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError(f"the body is not JSON ({body[:60]!r})") from None
    if not isinstance(data, dict):
        raise ValueError(f"the body is a JSON {type(data).__name__}, not an object")
    choices = data.get("choices")
    if not isinstance(choices, list):
        raise ValueError(f"'choices' is not a list ({choices!r})")
    if not choices:
        return Completion("", *_usage(data))
    if not isinstance(choices[0], dict):
        raise ValueError(f"'choices[0]' is not an object ({choices[0]!r})")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise ValueError(f"'choices[0].message' is not an object ({message!r})")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise ValueError(f"'choices[0].message.content' is {content!r}, not text")
    return Completion(content or "", *_usage(data))


def _usage(data: dict[str, Any]) -> tuple[int, int]:
    """(prompt, completion) tokens as the server counted them; 0 for what it did not count (or not as a number)."""
    given = data.get("usage")
    usage: dict[str, Any] = given if isinstance(given, dict) else {}

    def count(n: Any) -> int:
        return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else 0

    return count(usage.get("prompt_tokens")), count(usage.get("completion_tokens"))


# ---------------------------------------------------------------- recorded answers

def request_key(model: str, messages: list[Message], temperature: float, max_tokens: int, seed: int | None) -> str:
    blob = json.dumps([model, messages, temperature, max_tokens, seed], ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass
class CallCache:
    """Answers by request, appended to `path` as they come (a line cut off by a kill is ignored on reading)."""

    path: Path | None = None
    answers: dict[str, Completion] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.path is None or not self.path.is_file():
            return
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
                self.answers[row["key"]] = Completion(row["text"], row["prompt_tokens"], row["completion_tokens"])
            except (json.JSONDecodeError, KeyError, TypeError):
                continue

    def get(self, key: str) -> Completion | None:
        with self._lock:
            return self.answers.get(key)

    def put(self, key: str, completion: Completion) -> None:
        with self._lock:
            self.answers[key] = completion
            if self.path is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                row = {"key": key, "text": completion.text, "prompt_tokens": completion.prompt_tokens,
                       "completion_tokens": completion.completion_tokens}
                with self.path.open("a", encoding="utf-8") as handle:
                    handle.write(json.dumps(row, ensure_ascii=False) + "\n")


class CachedLLM:
    """`llm` behind a CallCache: a request already answered is answered from the cache (`cached=True`)."""

    def __init__(self, llm: LLM, cache: CallCache) -> None:
        self.llm, self.cache, self.name = llm, cache, llm.name

    def complete(self, messages: list[Message], *, temperature: float, max_tokens: int,
                 seed: int | None = None) -> Completion:
        key = request_key(self.name, messages, temperature, max_tokens, seed)
        hit = self.cache.get(key)
        if hit is not None:
            return Completion(hit.text, hit.prompt_tokens, hit.completion_tokens, cached=True)
        answer = self.llm.complete(messages, temperature=temperature, max_tokens=max_tokens, seed=seed)
        self.cache.put(key, answer)
        return answer


# ---------------------------------------------------------------- what the calls cost

@dataclass
class RoleUsage:
    calls: int = 0
    cached: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass
class Usage:
    """Calls and tokens per role (rollout, summary, advantage, group_update, batch_update, judge, eval)."""

    roles: dict[str, RoleUsage] = field(default_factory=dict)
    seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, role: str, completion: Completion) -> None:
        with self._lock:
            usage = self.roles.setdefault(role, RoleUsage())
            usage.calls += 1
            usage.cached += completion.cached
            usage.prompt_tokens += completion.prompt_tokens
            usage.completion_tokens += completion.completion_tokens

    def calls(self, *roles: str) -> int:
        return sum(u.calls for r, u in self.roles.items() if not roles or r in roles)

    def cost(self, role: str, prices: dict[str, list[float]] | None) -> float | None:
        """Dollars for `role` from prices {"rollout"|"updater"|role: [per 1M prompt, per 1M completion tokens]}."""
        if not prices:
            return None
        price = prices.get(role) or prices.get("rollout" if role in ("rollout", "eval") else "updater")
        if not price:
            return None
        usage = self.roles[role]
        return (usage.prompt_tokens * price[0] + usage.completion_tokens * price[1]) / 1e6

    def report(self, prices: dict[str, list[float]] | None = None) -> str:
        lines = [f"{'role':<14}{'calls':>7}{'cached':>8}{'prompt tok':>12}{'compl. tok':>12}{'cost $':>10}"]
        total_cost: float | None = None
        for role, u in self.roles.items():
            cost = self.cost(role, prices)
            if cost is not None:
                total_cost = (total_cost or 0.0) + cost
            lines.append(f"{role:<14}{u.calls:>7}{u.cached:>8}{u.prompt_tokens:>12}{u.completion_tokens:>12}"
                         f"{'' if cost is None else f'{cost:.4f}':>10}")
        total = RoleUsage(sum(u.calls for u in self.roles.values()), sum(u.cached for u in self.roles.values()),
                          sum(u.prompt_tokens for u in self.roles.values()),
                          sum(u.completion_tokens for u in self.roles.values()))
        lines.append(f"{'total':<14}{total.calls:>7}{total.cached:>8}{total.prompt_tokens:>12}"
                     f"{total.completion_tokens:>12}{'' if total_cost is None else f'{total_cost:.4f}':>10}")
        lines.append(f"wall time {self.seconds:.1f} s")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 3),
                "roles": {r: vars(u).copy() for r, u in self.roles.items()}}
