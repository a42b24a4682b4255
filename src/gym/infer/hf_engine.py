"""The Hugging Face inference engine: one model, many concurrent requests, shared forward passes.

Requests are scheduled per decoding step (iteration-level scheduling, as in Orca and vLLM): a
background thread keeps a running batch whose rows share one KV cache. Each step decodes one token
for every running row; requests that arrived meanwhile are prefilled together and join the batch at
the next step, and finished rows leave it at once. So a new request waits for one step, never for
another user's whole answer, and concurrent users share each forward pass.

The batch is left-padded: every row's cache ends at the same column, with an attention mask that
hides the padding and position ids counted from each row's first real token. Joining two batches
pads the shorter cache on the left; leaving drops the row and any leading columns that became all
padding. transformers provides the model and the cache; the scheduling is ours.

Sampling is per request (temperature, top_p, top_k, repetition_penalty, seed, stop strings;
gym.infer.sampling), so a seeded request samples from its own generator whatever else shares its batch.

This is the engine for any transformers model on any device; Llama-family models on the CPU get the
faster gym.infer.fast engine (infer_backend: auto).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from gym.infer.batching import BatchingEngine
from gym.infer.emit import finish, report_token
from gym.infer.requests import Request
from gym.infer.sampling import sample_rows
from gym.models.logit_positions import last_positions

logger = logging.getLogger(__name__)


class HFEngine(BatchingEngine):
    """Dynamic batching over a transformers causal LM. `max_batch_size` rows decode together;
    up to `max_waiting` requests wait for a row, and one more is refused with EngineBusy."""

    def __init__(self, model: Any, tokenizer: Any, stop_token_ids: list[int], *, max_batch_size: int = 16,
                 max_waiting: int = 256) -> None:
        super().__init__(tokenizer, stop_token_ids, max_batch_size=max_batch_size, max_waiting=max_waiting)
        self.model = model
        if self.max_batch_size > 1 and not _plain_cache(model):
            logger.warning("This model's KV cache is not a plain key/value cache; serving one request at a time.")
            self.max_batch_size = 1
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self._rows: list[Request] = []
        self._joining: list[Request] = []
        self._cache: Any = None
        self._mask: torch.Tensor | None = None
        self._start()

    # -- the engine thread ----------------------------------------------------------------------
    def _busy(self) -> bool:
        return bool(self._rows)

    def _in_flight(self) -> list[Request]:
        return self._rows + self._joining

    def _take_waiting(self) -> None:
        free = self.max_batch_size - len(self._rows)
        self._joining = [self._waiting.popleft() for _ in range(min(free, len(self._waiting)))]

    def _step(self) -> None:
        joining, self._joining = [r for r in self._joining if not self._drop_if_cancelled(r)], []
        if joining:
            self._prefill(joining)
        elif self._rows:
            self._decode()

    def _reset(self) -> None:
        self._rows, self._joining, self._cache, self._mask = [], [], None, None

    def _drop_if_cancelled(self, request: Request) -> bool:
        if request.cancelled:
            finish(request, "cancelled")
        return request.cancelled

    def _forward(self, input_ids: torch.Tensor, mask: torch.Tensor, cache: Any) -> torch.Tensor:
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)[:, -input_ids.shape[1]:]
        out = self.model(input_ids=input_ids.to(self.model.device), attention_mask=mask.to(self.model.device),
                         position_ids=positions.to(self.model.device), past_key_values=cache, use_cache=True,
                         logits_to_keep=last_positions(1, input_ids.shape[1], self.model.device))
        logits: torch.Tensor = out.logits[:, -1, :].float().cpu()
        return logits

    def _prefill(self, joining: list[Request]) -> None:
        width = max(len(r.prompt_ids) for r in joining)
        ids = torch.full((len(joining), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(joining), width), dtype=torch.long)
        for row, request in enumerate(joining):
            ids[row, width - len(request.prompt_ids):] = torch.tensor(request.prompt_ids)
            mask[row, width - len(request.prompt_ids):] = 1
        cache = DynamicCache(config=self.model.config)
        logits = self._forward(ids, mask, cache)
        self._join(joining, cache, mask)
        self._advance(joining, logits, first_row=len(self._rows) - len(joining))

    def _decode(self) -> None:
        assert self._mask is not None
        last = torch.tensor([[r.generated[-1]] for r in self._rows])
        self._mask = torch.cat([self._mask, torch.ones((len(self._rows), 1), dtype=self._mask.dtype)], dim=1)
        logits = self._forward(last, self._mask, self._cache)
        self._advance(list(self._rows), logits, first_row=0)

    def _join(self, joining: list[Request], cache: Any, mask: torch.Tensor) -> None:
        if not self._rows:
            self._rows, self._cache, self._mask = list(joining), cache, mask
            return
        assert self._mask is not None
        width = max(self._mask.shape[1], mask.shape[1])
        for old, new in zip(self._cache.layers, cache.layers):
            old.keys = torch.cat([_pad_left(old.keys, width), _pad_left(new.keys, width)])
            old.values = torch.cat([_pad_left(old.values, width), _pad_left(new.values, width)])
        self._mask = torch.cat([_pad_left(self._mask, width, dim=1), _pad_left(mask, width, dim=1)])
        self._rows.extend(joining)

    def _advance(self, rows: list[Request], logits: torch.Tensor, first_row: int) -> None:
        """Pick each row's next token, report it, and let finished rows leave the batch."""
        done = []
        for offset, (request, token) in enumerate(zip(rows, sample_rows(rows, logits))):
            request.generated.append(token)
            reason = report_token(request, token, self.tokenizer, self.stop_token_ids)
            if reason is not None:
                done.append(first_row + offset)
                finish(request, reason)
        if done:
            self._leave(done)

    def _leave(self, rows: list[int]) -> None:
        keep = [i for i in range(len(self._rows)) if i not in set(rows)]
        self._rows = [self._rows[i] for i in keep]
        if not self._rows:
            self._cache, self._mask = None, None
            return
        assert self._mask is not None
        index = torch.tensor(keep)
        self._cache.batch_select_indices(index)
        self._mask = self._mask[index]
        # Columns that are padding for every remaining row cost attention time for nothing.
        start = int(self._mask.any(0).float().argmax())
        if start > 0:
            self._mask = self._mask[:, start:]
            for layer in self._cache.layers:
                layer.keys, layer.values = layer.keys[:, :, start:], layer.values[:, :, start:]


def _pad_left(tensor: torch.Tensor, width: int, dim: int = -2) -> torch.Tensor:
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


def _plain_cache(model: Any) -> bool:
    """Whether every layer caches plain keys and values that rows can be padded and stacked in."""
    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=model.config).layers)
