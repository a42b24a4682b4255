"""Limits checked before any work: a request body over `max_body_bytes` is refused with 413 while it is
still arriving (not after it was read and tokenized), and text longer than the model's context could
ever use is refused with 400 before it reaches the tokenizer."""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gym.serve.protocol import ApiError

# Tokens of an answer held back per guard check (gym.serve.guarding): a short window stops a flagged answer sooner,
# a long one costs fewer guard calls and reads later.
DEFAULT_GUARD_WINDOW = 16
DEFAULT_MAX_BODY_BYTES = 4 << 20  # 4 MiB: a full 128k-token context of text is ~0.5 MB of JSON
DRAIN_BYTES = 256 << 20  # past this much refused body the connection is simply closed
CHARS_PER_TOKEN_BOUND = 8  # a token of real text is rarely over 8 characters: text beyond that cannot fit


class BodyLimit:
    """ASGI middleware: 413 for a body over `max_bytes`, by its Content-Length or, for a chunked body, as
    soon as the bytes received pass the limit; either way before the app reads or parses any of it."""

    def __init__(self, app: ASGIApp, max_bytes: int, exempt: tuple[str, ...] = ()) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.exempt = exempt  # paths whose routes stream their bodies under limits of their own (uploads)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in self.exempt:
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._drain(receive)
            await self._refuse(send)
            return
        # Read the body here, at most max_bytes of it, and hand the app what was read: a chunked body with no
        # Content-Length is stopped as soon as it passes the limit, not after the app has parsed all of it.
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left before sending its body
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._drain(receive)
                await self._refuse(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # later calls: the disconnect, for streaming responses

        await self.app(scope, replay, send)

    async def _drain(self, receive: Receive) -> None:
        """Read and drop the rest of the body (up to a bound), so that the client, still sending, gets to
        read the 413 instead of a reset connection. Nothing is kept: memory stays flat."""
        dropped = 0
        while dropped < DRAIN_BYTES:
            message = await receive()
            if message["type"] != "http.request":
                return
            dropped += len(message.get("body", b""))
            if not message.get("more_body", False):
                return

    async def _refuse(self, send: Send) -> None:
        error = ApiError(413, f"The request body is over {self.max_bytes} bytes (the server's --max_body_bytes).",
                         param=None, code="request_too_large")
        body = json.dumps(error.body()).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def check_text_length(texts: list[tuple[str, Any]], context_tokens: int) -> None:
    """(field, text) pairs: each text must be short enough that it could fit the context at all."""
    limit = context_tokens * CHARS_PER_TOKEN_BOUND
    for field, text in texts:
        if isinstance(text, str) and len(text) > limit:
            raise ApiError(400, f"{field} is {len(text)} characters; this model's context ({context_tokens} tokens) "
                                f"cannot hold more than ~{limit}.", param=field, code="context_length_exceeded")
