"""The engine for vision-language models: one request at a time, through transformers' own `generate`.

A multimodal prompt is its ids (each image already expanded into its run of image tokens by the model's
processor) plus the processor's tensors (`pixel_values`, and `image_sizes`, `image_grid_thw`, ... whatever the
family takes). Families differ in what their forward needs beyond that (Qwen2-VL's 3-D rotary positions and their
per-request offsets, Gemma 3's token types that switch image tokens to bidirectional attention), and `generate`
is where transformers keeps each family's bookkeeping. So this engine calls `generate` once per request and does
not batch: requests wait in the shared bounded queue (gym.infer.batching) and run one after another. Batching
them would mean teaching gym.infer.hf_engine every family's position and cache rules, for a CPU/small-GPU
deployment where a VLM's prefill of a few hundred image tokens dominates anyway.

Decoding is still Gym's, token for token the same settings as every other engine: at each step a logits processor
picks the request's token with gym.infer.sampling (temperature, top_p, top_k, repetition_penalty, seed, a
grammar's mask) and hands `generate` scores that allow only that token, so `generate`'s own greedy search takes
it; a stopping criterion reports it (gym.infer.emit: incremental text, stop tokens and strings, the length limit)
and ends the generation when the request finishes, is cancelled or the engine shuts down. Requests without media
are served the same way (a VLM's text-only turns), so one engine serves the whole model.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

from gym.infer.batching import OneRequestEngine
from gym.infer.emit import finish, report_token
from gym.infer.requests import Request
from gym.infer.sampling import sample_rows

logger = logging.getLogger(__name__)


class MultimodalEngine(OneRequestEngine):
    """The Engine protocol over a multimodal model's `generate`: one request runs at a time, up to
    `max_waiting` wait for it, one more is refused with EngineBusy."""

    thread_name = "gym-vlm-engine"
    takes_media = True

    def __init__(self, model: Any, tokenizer: Any, stop_token_ids: list[int], *, max_waiting: int = 256) -> None:
        super().__init__(tokenizer, stop_token_ids, max_waiting=max_waiting)
        self.model = model
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self._start()

    def _step(self) -> None:
        request = self._current
        if request is None:
            return
        if request.cancelled:
            finish(request, "cancelled")
        else:
            self._generate(request)
        # Only now: if generate() raised, the request stays in flight, so the engine loop tells it how it ended.
        self._current = None

    def _generate(self, request: Request) -> None:
        device = self.model.device
        dtype = next(self.model.parameters()).dtype
        ids = torch.tensor([request.prompt_ids], device=device)
        # Pixels come from the processor in float32; the model may run in bf16/fp16 (ids and sizes stay integers).
        media = {key: value.to(device=device, dtype=dtype) if value.is_floating_point() else value.to(device)
                 for key, value in (request.media or {}).items()}
        stopper = _Report(self, request)
        # Every value that changes scores is given explicitly: generate() fills unset (None) ones from the model's
        # generation_config, and a repetition penalty or min length applied there would change what the picker sees.
        config = GenerationConfig(max_new_tokens=request.params.max_new_tokens, do_sample=False, num_beams=1,
                                  repetition_penalty=1.0, no_repeat_ngram_size=0, min_new_tokens=0,
                                  pad_token_id=self.pad_id, eos_token_id=sorted(self.stop_token_ids) or None,
                                  renormalize_logits=False)
        self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **media, generation_config=config,
                            logits_processor=LogitsProcessorList([_Pick(request)]),
                            stopping_criteria=StoppingCriteriaList([stopper]))
        finish(request, stopper.reason or ("cancelled" if not self._running else "length"))


class _Pick(LogitsProcessor):
    """Gym's sampling of the request's next token; the scores returned allow that token alone."""

    def __init__(self, request: Request) -> None:
        self.request = request

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        token = sample_rows([self.request], scores[-1:].float().cpu().clone())[0]
        forced = torch.full_like(scores, float("-inf"))
        forced[:, token] = 0.0
        return forced  # type: ignore[return-value]


class _Report(StoppingCriteria):
    """Reports each new token as the other engines do, and stops generate() once the request is over."""

    def __init__(self, engine: MultimodalEngine, request: Request) -> None:
        self.engine, self.request = engine, request
        self.reason: str | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        if self.reason is None:
            token = int(input_ids[0, -1])
            self.request.generated.append(token)
            self.reason = report_token(self.request, token, self.engine.tokenizer, self.engine.stop_token_ids)
            if self.reason is None and not self.engine._running:
                self.reason = "cancelled"  # shutting down: the step in flight ends now, not after its answer
        done = torch.full((input_ids.shape[0],), self.reason is not None, dtype=torch.bool, device=input_ids.device)
        return done  # type: ignore[return-value]
