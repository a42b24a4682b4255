"""`gym api --guard SPEC`: a guard checks every request before it decodes, and every answer while it streams.

Input: the conversation's last message (or each completion prompt) is judged before anything is submitted; a
flagged one is refused with a 400 whose error code is `content_filter`, as Azure OpenAI refuses a filtered prompt.

Output: each answer's text is held back in windows of `window` tokens. When a window fills (and when the answer
ends), the guard judges the whole answer so far, with the conversation before it as context; a clean window is
released to the client, and at the first flagged one the answer stops there: its decoding is cancelled, the
flagged window is never sent, and the choice ends with `finish_reason: "content_filter"`, as OpenAI ends a
filtered completion. Holding a window back is the price: a streamed answer reaches the client `window` tokens
late, and every window costs one guard call (measured in bench/guard_latency.py).

The same guard answers OpenAI's POST /v1/moderations (`moderation_routes`).
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter

from gym.infer.requests import Event, Finished, Piece
from gym.safety.guard import Guard
from gym.safety.taxonomy import openai_categories
from gym.safety.verdict import Message, Verdict
from gym.serve.limits import DEFAULT_GUARD_WINDOW
from gym.serve.protocol import ApiError, ModerationRequest, TextPart
from gym.serve.tenancy import Caller


@dataclass
class GuardPolicy:
    guard: Guard
    window: int = DEFAULT_GUARD_WINDOW
    """Tokens per output window: how often an answer is checked, and how far behind decoding the client reads."""
    max_batch: int = 32
    """Checks judged in one guard call: every check waiting when the guard is free goes in the next call."""
    checks: int = field(default=0, init=False)
    _pending: list[tuple[list[Message], asyncio.Future[Verdict]]] = field(default_factory=list, init=False)
    _worker: asyncio.Task[None] | None = field(default=None, init=False)

    async def judge(self, conversation: list[Message]) -> Verdict:
        """The guard's verdict, batched with every other check that waits meanwhile: at 16 streams a model guard
        judges 16 windows in one forward pass instead of 16 (bench/guard_latency.py)."""
        self.checks += 1
        future: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
        self._pending.append((conversation, future))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._pending:
            batch, self._pending = self._pending[:self.max_batch], self._pending[self.max_batch:]
            try:
                verdicts = await asyncio.to_thread(self.guard.check_batch, [c for c, _ in batch])
            except Exception as exc:  # the waiting requests fail with it; later checks try again
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, future), verdict in zip(batch, verdicts):
                if not future.done():  # a request whose client left has stopped waiting
                    future.set_result(verdict)

    async def check_input(self, conversation: list[Message], param: str) -> None:
        verdict = await self.judge(conversation)
        if verdict.flagged:
            raise ApiError(400, f"The request was refused by this server's content filter ({_named(verdict)}).",
                           param=param, code="content_filter")

    def filter(self, events: asyncio.Queue[tuple[int, Event]], handles: list[Any],
               contexts: list[list[Message]]) -> tuple[asyncio.Queue[tuple[int, Event]], asyncio.Task[None]]:
        """A queue of the same events with each answer checked window by window (see the module docstring),
        and the task that fills it (cancel it when the response ends early)."""
        out: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        task = asyncio.create_task(self._run(events, out, handles, contexts))
        return out, task

    async def _run(self, events: asyncio.Queue[tuple[int, Event]], out: asyncio.Queue[tuple[int, Event]],
                   handles: list[Any], contexts: list[list[Message]]) -> None:
        answers = [_Answer() for _ in handles]
        remaining = len(handles)
        while remaining:
            index, event = await events.get()
            answer = answers[index]
            if answer.stopped:  # the engine's own end of an answer we cut: already reported
                if isinstance(event, Finished):
                    remaining -= 1
                continue
            if isinstance(event, Piece):
                answer.held.append(event)
                answer.held_tokens += max(1, len(event.token_ids))
                if answer.held_tokens >= self.window and not await self._release(index, answer, contexts, out):
                    handles[index].cancel()
                continue
            if event.reason == "cancelled" or await self._release(index, answer, contexts, out):
                out.put_nowait((index, event))
                remaining -= 1
            else:  # flagged in the last window: the engine has already finished, nothing to cancel
                remaining -= 1

    async def _release(self, index: int, answer: _Answer, contexts: list[list[Message]],
                       out: asyncio.Queue[tuple[int, Event]]) -> bool:
        """Judge the answer so far; send the held pieces if clean, else end the choice. Whether it was clean."""
        held_text = "".join(p.text for p in answer.held)
        if held_text.strip():
            verdict = await self.judge([*contexts[index], {"role": "assistant", "content": answer.sent + held_text}])
            if verdict.flagged:
                answer.stopped = True
                generated = answer.sent_tokens + answer.held_tokens  # the flagged window was decoded all the same
                out.put_nowait((index, Finished("content_filter", 0, generated, answer.sent)))
                return False
        for piece in answer.held:
            out.put_nowait((index, piece))
        answer.sent += held_text
        answer.sent_tokens += answer.held_tokens
        answer.held, answer.held_tokens = [], 0
        return True


@dataclass
class _Answer:
    held: list[Piece] = field(default_factory=list)
    held_tokens: int = 0
    sent: str = ""
    sent_tokens: int = 0
    stopped: bool = False


def moderation_routes(policy: GuardPolicy | None) -> APIRouter:
    """OpenAI's POST /v1/moderations, answered by the server's guard (a 404 without one)."""
    router = APIRouter()

    @router.post("/v1/moderations")
    async def moderations(body: ModerationRequest, who: Caller) -> dict[str, Any]:
        if policy is None:
            raise ApiError(404, "This server has no moderation model: start gym api with --guard SPEC (a guard "
                                "model or keywords:FILE).", param="model", code="model_not_found")
        conversations = [[{"role": "user", "content": text}] for text in body.texts()]
        verdicts = await asyncio.to_thread(policy.guard.check_batch, conversations)
        return {"id": f"modr-{uuid.uuid4().hex}", "model": body.model or policy.guard.spec,
                "results": [moderation_result(v) for v in verdicts]}

    return router


def moderation_result(verdict: Verdict) -> dict[str, Any]:
    """One input's entry of OpenAI's moderation response (categories in OpenAI's names; see gym.safety.taxonomy)."""
    categories, scores = openai_categories(verdict)
    return {"flagged": verdict.flagged, "categories": categories, "category_scores": scores,
            "category_applied_input_types": {name: ["text"] for name in categories}}


def guard_conversation(messages: list[Any]) -> list[Message]:
    """A chat request's messages as a guard reads them: system prompts left out, tool results as user input, and
    only the text of content parts (a guard reads no images, and the `<image>` the model gets in an image's place is
    not the client's text: a keyword list matching it flagged every request with an image)."""
    return [{"role": "assistant" if m.role == "assistant" else "user",
             "content": "".join(p.text for p in m.content if isinstance(p, TextPart))
             if isinstance(m.content, list) else m.text()}
            for m in messages if m.role not in ("system", "developer")]


def _named(verdict: Verdict) -> str:
    names = verdict.flagged_categories
    return f"flagged: {', '.join(names)}" if names else "flagged"
