"""FastEngine: dynamic batching on the fast decoder (gym.infer.fast.model), with chunked prefill.

Each request holds one slot of the decoder's KV cache from its prefill to its last token. The engine
thread loops: admit a waiting request into a free slot (restoring any cached prefix of its prompt),
compute one chunk of at most `prefill_chunk` prompt tokens for the request being prefilled, then one
decode step for every running request. So a long prompt joining the batch delays running requests by
one chunk per step, never by its whole prefill, and a request waits for at most one step to start.
Running requests sit in slots 0..n-1 (when one leaves, the ones after it move down), so a decode step
reads one contiguous block of the cache.

The interface and guarantees are HFEngine's (gym.infer.requests): per-request sampling settings,
seeds, stop strings, cancellation, a bounded waiting queue.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from gym.infer.batching import BatchingEngine
from gym.infer.emit import finish, report_token
from gym.infer.fast.model import FastDecoder
from gym.infer.fast.prefix import PrefixCache
from gym.infer.requests import Request
from gym.infer.sampling import sample_rows

logger = logging.getLogger(__name__)


WHOLE_PREFILL = 2048  # prompt tokens per chunk while no request is decoding


@dataclass
class _Row:
    request: Request
    slot: int
    length: int = 0  # positions in the slot's cache


class FastEngine(BatchingEngine):
    """The Engine protocol over FastDecoder; `dtype` is the served weight format (float32, bfloat16,
    float16, int8, int4)."""

    thread_name = "gym-fast-engine"

    def __init__(self, model: Any, tokenizer: Any, stop_token_ids: list[int], *, dtype: str = "float32",
                 max_batch_size: int = 16, max_waiting: int = 256, prefill_chunk: int = 256,
                 prefix_cache_mb: int = 256, max_length: int | None = None,
                 idle_prefill_chunk: int = WHOLE_PREFILL) -> None:
        super().__init__(tokenizer, stop_token_ids, max_batch_size=max_batch_size, max_waiting=max_waiting)
        started = time.perf_counter()
        self.decoder = FastDecoder(model, dtype, slots=self.max_batch_size, max_length=max_length)
        self.prefix = PrefixCache(self.decoder, prefix_cache_mb << 20)
        self.prefill_chunk = max(1, prefill_chunk)
        self.idle_prefill_chunk = max(self.prefill_chunk, idle_prefill_chunk)
        self.dtype = dtype
        self._decoding: list[_Row] = []
        self._prefilling: _Row | None = None
        logger.info("Fast engine ready in %.1fs: weights as %s (%.0f MB read per token)", time.perf_counter() - started,
                    dtype, self.decoder.weight_bytes / 1e6)
        self._start()

    # -- the engine thread ----------------------------------------------------------------------------
    def _busy(self) -> bool:
        return bool(self._decoding) or self._prefilling is not None

    def _in_flight(self) -> list[Request]:
        rows = self._decoding + ([self._prefilling] if self._prefilling is not None else [])
        return [row.request for row in rows]

    def _take_waiting(self) -> None:
        if self._prefilling is None and self._waiting and len(self._decoding) < self.max_batch_size:
            self._prefilling = _Row(self._waiting.popleft(), slot=len(self._decoding))

    def _step(self) -> None:
        if self._prefilling is not None:
            self._prefill_chunk(self._prefilling)
        if self._decoding:
            self._decode()

    def _reset(self) -> None:
        self._decoding, self._prefilling = [], None

    def _prefill_chunk(self, row: _Row) -> None:
        request = row.request
        prompt = request.prompt_ids
        if request.cancelled or len(prompt) >= self.decoder.max_length:
            self._prefilling = None
            finish(request, "cancelled" if request.cancelled else "length")
            return
        if row.length == 0:
            row.length = self.prefix.restore(row.slot, prompt)
        # Chunks keep running requests moving; with none running, fewer and larger chunks reach the first
        # token sooner (each chunk reads every weight once more, and int formats expand them per chunk).
        size = self.prefill_chunk if self._decoding else self.idle_prefill_chunk
        chunk = prompt[row.length:row.length + size]
        logits = self.decoder.prefill(row.slot, chunk, row.length)
        row.length += len(chunk)
        if row.length < len(prompt):
            return
        self._prefilling = None
        self.prefix.store(row.slot, prompt)
        if not self._emit(row, sample_rows([request], logits[None])[0]):
            self._decoding.append(row)
            self._compact()

    def _decode(self) -> None:
        rows = self._decoding
        logits = self.decoder.decode([row.request.generated[-1] for row in rows], [row.length for row in rows])
        for row in rows:
            row.length += 1
        tokens = sample_rows([row.request for row in rows], logits)
        finished = {id(row) for row, token in zip(rows, tokens) if self._emit(row, token)}
        if finished:
            self._decoding = [row for row in rows if id(row) not in finished]
            self._compact()

    def _emit(self, row: _Row, token: int) -> bool:
        """Report a sampled token; True when the request is done."""
        request = row.request
        request.generated.append(token)
        reason = report_token(request, token, self.tokenizer, self.stop_token_ids)
        if reason is None and row.length + 1 >= self.decoder.max_length:
            reason = "length"
        if reason is not None:
            finish(request, reason)
        return reason is not None

    def _compact(self) -> None:
        """Running rows into slots 0..n-1 in order, then the row being prefilled."""
        order = self._decoding + ([self._prefilling] if self._prefilling is not None else [])
        for index, row in enumerate(order):
            if row.slot != index:
                self.decoder.move_slot(row.slot, index, row.length)
                row.slot = index
