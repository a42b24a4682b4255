"""FastEngine: dynamic batching on the fast decoder (gym.infer.fast.cpu, or .gpu for a model on a CUDA GPU),
with chunked prefill.

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

import torch

from gym.infer.batching import BatchingEngine
from gym.infer.emit import finish, report_token
from gym.infer.fast.bank import VariantBank
from gym.infer.fast.cpu import FastDecoder
from gym.infer.fast.deltas import CompiledVariant
from gym.infer.fast.gpu import GpuDecoder
from gym.infer.fast.pack_cache import PackCache
from gym.infer.fast.prefix import PrefixCache
from gym.infer.requests import Request
from gym.infer.sampling import sample_rows

logger = logging.getLogger(__name__)

# Prefill chunks one step may take when no request is decoding (see FastEngine._prefill_step).
IDLE_CHUNKS = 16


@dataclass
class _Row:
    request: Request
    slot: int
    length: int = 0  # positions in the slot's cache


class FastEngine(BatchingEngine):
    """The Engine protocol over FastDecoder (CPU) or GpuDecoder (a model on a CUDA GPU); `dtype` is the
    served weight format on the CPU (float32, bfloat16, float16, int8, int4); a GPU serves the model's own.
    `compile`: on a GPU, whether to torch.compile the decode step before capturing it (infer_compile).
    `prefill_chunk`: prompt tokens per step; 0 takes the decoder's own choice (its `prefill_chunk`).
    `variants`: the per-user variants a request may name (SamplingParams.variant), served in the same
    batches as the base (gym.infer.fast.deltas). `packed`: the cache of int8/int4 weights packed on earlier starts
    (gym.infer.fast.pack_cache; CPU only)."""

    thread_name = "gym-fast-engine"

    def __init__(self, model: Any, tokenizer: Any, stop_token_ids: list[int], *, dtype: str = "float32",
                 max_batch_size: int = 16, max_waiting: int = 256, prefill_chunk: int = 0,
                 prefix_cache_mb: int = 256, max_length: int | None = None, compile: bool = False,
                 variants: VariantBank | None = None, packed: PackCache | None = None) -> None:
        super().__init__(tokenizer, stop_token_ids, max_batch_size=max_batch_size, max_waiting=max_waiting)
        started = time.perf_counter()
        self.decoder: FastDecoder | GpuDecoder
        if next(model.parameters()).device.type == "cuda":
            if dtype in ("int8", "int4"):
                raise ValueError(f"{dtype} weights are the CPU engine's; on a GPU the model serves in its own dtype")
            self.decoder = GpuDecoder(model, slots=self.max_batch_size, max_length=max_length, compile=compile)
            self.decoder.warm_up()
            dtype = self.decoder.dtype
        else:
            self.decoder = FastDecoder(model, dtype, slots=self.max_batch_size, max_length=max_length, packed=packed)
        self.prefix = PrefixCache(self.decoder, prefix_cache_mb << 20)
        self.prefill_chunk = prefill_chunk if prefill_chunk > 0 else self.decoder.prefill_chunk
        self.variants = variants
        self.dtype = dtype
        self._decoding: list[_Row] = []
        self._prefilling: list[_Row] = []
        logger.info("Fast engine ready in %.1fs (%s): weights as %s (%.0f MB read per token)",
                    time.perf_counter() - started, self.decoder.spec, dtype, self.decoder.weight_bytes / 1e6)
        if isinstance(self.decoder, GpuDecoder) and self.decoder.use_graphs:
            compiled = "compiled with torch.compile" if self.decoder.compiled else "eager kernels"
            logger.info("Decode steps replay CUDA graphs (%s), %.1fs of capture so far", compiled,
                        self.decoder.graph_seconds)
        self._start()

    def _variant(self, name: str) -> CompiledVariant | None:
        return self.variants.get(name) if self.variants is not None else None

    # -- the engine thread ----------------------------------------------------------------------------
    def _busy(self) -> bool:
        return bool(self._decoding) or bool(self._prefilling)

    def _in_flight(self) -> list[Request]:
        return [row.request for row in self._decoding + self._prefilling]

    def _take_waiting(self) -> None:
        while self._waiting and len(self._decoding) + len(self._prefilling) < self.max_batch_size:
            self._prefilling.append(_Row(self._waiting.popleft(), slot=len(self._decoding) + len(self._prefilling)))

    def _step(self) -> None:
        if self._prefilling:
            self._prefill_step()
        if self._decoding:
            self._decode()

    def _reset(self) -> None:
        self._decoding, self._prefilling = [], []

    def settle(self) -> None:
        """Do now what the engine does at its first idle moment (the weights into huge pages), so that what follows
        runs as a server that has been up for a second does: for benchmarks. Call it before any request."""
        if isinstance(self.decoder, FastDecoder):
            self.decoder.into_huge_pages()

    # The weights into huge pages once the engine stands idle (a one-row step ~1.15x faster): gym.infer.fast.huge_pages.
    def _unsettled(self) -> bool:
        return isinstance(self.decoder, FastDecoder) and not self.decoder.in_huge_pages

    def _settle(self) -> None:
        if isinstance(self.decoder, FastDecoder) and self.decoder.into_huge_pages():
            logger.info("Fast engine: weights moved into huge pages")

    def _prefill_step(self) -> None:
        """The next chunks of the requests being prefilled, oldest first, as many as fit this step's budget
        (at least one). A request's chunks are always [k * prefill_chunk, (k + 1) * prefill_chunk) of its own
        prompt (after what the prefix cache restored), whatever else is prefilling, so its numbers never
        depend on the load. Because the oldest request is served first, requests finish prefilling in the
        order they came. The budget is `prefill_chunk` tokens while requests are decoding (they wait for
        the step); with none, there is no one to hold up, and up to IDLE_CHUNKS chunks (of one request or
        several) share the step: one walk through the layers, int weights expanded once per layer for all
        of them instead of once per chunk."""
        budget = self.prefill_chunk * (1 if self._decoding else IDLE_CHUNKS)
        segments: list[tuple[int, list[int], int]] = []
        rows: list[_Row] = []
        used = 0
        for row in list(self._prefilling):
            request, prompt = row.request, row.request.prompt_ids
            if request.cancelled or len(prompt) >= self.decoder.max_length:
                self._prefilling.remove(row)
                finish(request, "cancelled" if request.cancelled else "length")
                continue
            if row.length == 0:
                row.length = self.prefix.restore(row.slot, prompt, _namespace(request))
            start = row.length
            while start < len(prompt):
                chunk = prompt[start:start + self.prefill_chunk]
                if segments and used + len(chunk) > budget:
                    break
                segments.append((row.slot, chunk, start))
                rows.append(row)
                used += len(chunk)
                start += len(chunk)
            if start < len(prompt):
                break
        done: list[tuple[_Row, torch.Tensor]] = []
        if segments:
            all_logits = self.decoder.prefill_many(segments, variants=[row.request.variant for row in rows])
            for row, (_, chunk, _), logits in zip(rows, segments, all_logits):
                row.length += len(chunk)
                if row.length == len(row.request.prompt_ids):
                    done.append((row, logits))
        if done:
            for row, _ in done:
                self._prefilling.remove(row)
                self.prefix.store(row.slot, row.request.prompt_ids, _namespace(row.request))
            tokens = sample_rows([row.request for row, _ in done], torch.stack([logits for _, logits in done]))
            self._decoding.extend(row for (row, _), token in zip(done, tokens) if not self._emit(row, token))
        self._compact()

    def _decode(self) -> None:
        rows = self._decoding
        logits = self.decoder.decode([row.request.generated[-1] for row in rows], [row.length for row in rows],
                                     [row.request.variant for row in rows])
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
        """Running rows into slots 0..n-1 in order, then the rows being prefilled. Rows only ever leave or
        move from the prefilling list to the end of the running one, so every move is to a lower slot and
        moving in order never overwrites a slot not yet moved."""
        for index, row in enumerate(self._decoding + self._prefilling):
            if row.slot != index:
                self.decoder.move_slot(row.slot, index, row.length)
                row.slot = index


def _namespace(request: Request) -> int:
    """Prefix-cache entries are per variant: the same prompt has other keys and values under another delta."""
    return request.variant.uid if request.variant is not None else 0
