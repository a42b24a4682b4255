"""The vLLM backend (`infer_backend: vllm`): vLLM's own continuous batching and paged KV cache behind
the same submit/events interface as HFEngine. vLLM needs a CUDA GPU; this module is imported only when
it is installed (gym.infer.engines), and tested against a fake AsyncLLMEngine.

vLLM runs on an asyncio loop that this engine owns in a background thread, so synchronous callers
(ChatModel) and the API server's loop both reach it through `submit`. One LoRA adapter is served
unmerged through vLLM's LoRA support; more than one must be merged first (gym export).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from vllm import AsyncEngineArgs, AsyncLLMEngine
from vllm import SamplingParams as VllmSampling
from vllm.lora.request import LoRARequest

from gym.core.errors import ConfigError
from gym.infer.requests import Event, Finished, Media, Piece, Request, SamplingParams, admit, refuse_media
from gym.models.adapters import check_adapter_weights

logger = logging.getLogger(__name__)


class VllmEngine:
    """The Engine interface (gym.infer.requests) over vLLM's AsyncLLMEngine, with HFEngine's guarantees:
    a bounded number of requests in flight (EngineBusy past it), no request after shutdown (EngineStopped),
    and every request ends with exactly one Finished event, whatever happens to it."""

    def __init__(self, model_path: str, adapters: list[str], stop_token_ids: list[int], *, max_batch_size: int,
                 max_waiting: int, trust_remote_code: bool = False) -> None:
        if len(adapters) > 1:
            raise ConfigError("infer_backend: vllm serves one LoRA adapter at a time; merge the others into the "
                              "model first, or use infer_backend: hf.")
        if adapters:
            check_adapter_weights(adapters[0])  # vLLM loads it itself, NaN or inf included
        self.stop_token_ids = stop_token_ids
        self.max_waiting = max_waiting
        self._lock = threading.Lock()
        self._running = True
        self._tasks: dict[Request, concurrent.futures.Future[None]] = {}
        self._lora = LoRARequest("adapter", 1, adapters[0]) if adapters else None
        args = AsyncEngineArgs(model=str(model_path), max_num_seqs=max_batch_size, enable_lora=bool(adapters),
                               trust_remote_code=trust_remote_code)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="gym-vllm", daemon=True)
        self._thread.start()

        async def start() -> Any:
            return AsyncLLMEngine.from_engine_args(args)

        self._engine = asyncio.run_coroutine_threadsafe(start(), self._loop).result()

    def submit(self, prompt_ids: list[int], params: SamplingParams,
               sink: Callable[[Event], None] | None = None, media: Media | None = None) -> Request:
        refuse_media(media)  # Gym hands vLLM token ids only; its multimodal inputs are not wired up
        with self._lock:
            request = admit(prompt_ids, params, sink, running=self._running, queued=len(self._tasks),
                            limit=self.max_waiting, queued_as="in flight")
            self._tasks[request] = asyncio.run_coroutine_threadsafe(self._run(request), self._loop)
        return request

    def _sampling(self, params: SamplingParams) -> Any:
        return VllmSampling(
            n=1, max_tokens=params.max_new_tokens, temperature=0.0 if params.greedy else params.temperature,
            top_p=params.top_p, top_k=params.top_k if params.top_k > 0 else -1,
            repetition_penalty=params.repetition_penalty, stop=params.stop or None,
            stop_token_ids=self.stop_token_ids, seed=params.seed, skip_special_tokens=True)

    async def _run(self, request: Request) -> None:
        request_id = uuid.uuid4().hex
        emitted_tokens, reason = 0, "cancelled"
        try:
            async for output in self._engine.generate({"prompt_token_ids": request.prompt_ids},
                                                      self._sampling(request.params), request_id,
                                                      lora_request=self._lora):
                if request.cancelled:
                    await self._engine.abort(request_id)
                    break
                completion = output.outputs[0]
                new_text = completion.text[len(request.text):]
                new_ids = list(completion.token_ids[emitted_tokens:])
                request.text, emitted_tokens = completion.text, len(completion.token_ids)
                request.generated = list(completion.token_ids)
                request.emit(Piece(new_text, new_ids))
                if completion.finish_reason is not None:
                    reason = {"length": "length", "stop": "stop"}.get(completion.finish_reason, "cancelled")
        except asyncio.CancelledError:  # shutdown: the Finished below still tells the caller
            pass
        except Exception as exc:  # a failure inside vLLM (out of memory, ...) must not leave the caller hanging
            logger.exception("vLLM failed on request %s: %s", request_id, exc)
        finally:
            with self._lock:
                self._tasks.pop(request, None)
            request.emit(Finished(reason, len(request.prompt_ids), len(request.generated), request.text))

    @property
    def load(self) -> dict[str, int]:
        with self._lock:
            return {"running": len(self._tasks), "waiting": 0}

    def shutdown(self, timeout: float = 30.0) -> None:
        """Refuse new requests, end those in flight (each gets its Finished), stop vLLM and the loop."""
        with self._lock:
            if not self._running:
                return
            self._running = False
            in_flight = list(self._tasks.values())
        for task in in_flight:
            task.cancel()
        deadline = time.monotonic() + timeout
        while self.load["running"] and time.monotonic() < deadline:  # each task removes itself when finished
            time.sleep(0.01)
        shutdown = getattr(self._engine, "shutdown", None)
        if callable(shutdown):
            shutdown()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._loop.close()
