"""What a new token adds to a request's answer: its text (decoded incrementally), stop tokens and stop
strings, the grammar of a constrained request (gym.infer.grammar), the length limit. Shared by every
engine that samples tokens itself (hf, fast, llama.cpp).

Decoding the whole answer after every token costs O(n^2) over an answer; here only a short window is
decoded: the text of tokens [prefix, read) is known, so decoding [prefix, end) and dropping that
known part gives exactly what the new tokens add, with the tokenizer's word-boundary handling intact
(a token's leading space depends on what precedes it, which is why the window starts a little back).
"""

from __future__ import annotations

import logging
from typing import Any

from gym.infer.requests import Finished, Piece, Request

logger = logging.getLogger(__name__)


def report_token(request: Request, token: int, tokenizer: Any, stop_token_ids: set[int]) -> str | None:
    """Emit what `token` (already appended to request.generated) adds; return the finish reason, or None."""
    if request.cancelled:
        return "cancelled"
    if token in stop_token_ids:
        tail = request.stop_filter.flush()
        request.text += tail
        request.emit(Piece(tail, [token]))
        return "stop"
    # A grammar that can produce nothing more ends the answer now, with the token that completed it: the
    # model need not be asked for an end-of-turn token the grammar would force anyway.
    matcher = request.matcher
    complete = matcher is not None and matcher.advance(token)
    failed = matcher is not None and complete and bool(matcher.error)
    if failed:
        logger.warning("Request %d left its grammar (%s); ending it", request.id, matcher and matcher.error)
    new = _new_text(request, tokenizer)
    out = request.stop_filter.push(new) if new else ""
    request.text += out
    request.emit(Piece(out, [token]))
    if request.stop_filter.stopped and not failed:
        return "stop"
    if complete or len(request.generated) >= request.params.max_new_tokens:
        tail = request.stop_filter.flush()
        if tail:
            request.text += tail
            request.emit(Piece(tail, []))
        # "stop" would tell the caller the answer matches its schema; one the grammar gave up on need not
        return ("error" if failed else "stop") if complete else "length"
    return None


def _new_text(request: Request, tokenizer: Any) -> str:
    ids = request.generated
    start, read = request.detok_offsets
    known = tokenizer.decode(ids[start:read], skip_special_tokens=True) if read > start else ""
    text = tokenizer.decode(ids[start:], skip_special_tokens=True)
    # A token that ends inside a multi-byte character decodes to U+FFFD: wait for the rest of it.
    if text.endswith("\ufffd") or len(text) <= len(known):
        return ""
    request.detok_offsets = (read, len(ids))
    return text[len(known):]


def finish(request: Request, reason: str) -> None:
    error = request.matcher.error if reason == "error" and request.matcher is not None else ""
    request.emit(Finished(reason, len(request.prompt_ids), len(request.generated), request.text, error))
