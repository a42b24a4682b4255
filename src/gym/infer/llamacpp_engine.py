"""The llama.cpp backend (`infer_backend: llamacpp`): a GGUF file served through llama-cpp-python, for
users who already run llama.cpp, with Gym's chat format, sampling, seeds, stop strings and queue around
it. Imported only when llama-cpp-python is installed (`pip install zoo-gym[llamacpp]`; it compiles
llama.cpp, several minutes on 2 cores).

llama.cpp computes the logits; everything after them is Gym's: the prompt is rendered and tokenized by
the model's Hugging Face tokenizer (the GGUF's own vocabulary, converted), and each token is chosen by
gym.infer.sampling, so a seeded request gives the same answer on this backend's logits as the sampler
would on any other's. llama-cpp-python's `Llama` holds one sequence, so requests are served one at a
time (the others wait in the queue); the KV of the longest prompt prefix shared with the previous
request is kept, as llama-server's prompt cache does. For many concurrent users the fast engine batches.
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import torch

from gym.core.errors import ConfigError
from gym.infer.batching import OneRequestEngine
from gym.infer.emit import finish, report_token
from gym.infer.sampling import sample_rows

logger = logging.getLogger(__name__)


class LlamaCppEngine(OneRequestEngine):
    """The Engine protocol over llama_cpp.Llama; one request decodes at a time."""

    thread_name = "gym-llamacpp-engine"

    def __init__(self, gguf_path: str | os.PathLike[str], tokenizer: Any, stop_token_ids: list[int], *,
                 max_waiting: int = 256, adapters: list[str] | None = None, n_ctx: int = 0,
                 n_threads: int | None = None) -> None:
        super().__init__(tokenizer, stop_token_ids, max_waiting=max_waiting)
        adapters = adapters or []
        if len(adapters) > 1 or any(not str(a).endswith(".gguf") for a in adapters):
            raise ConfigError("infer_backend: llamacpp serves at most one LoRA adapter, as a GGUF adapter file "
                              f"(got {', '.join(map(str, adapters))}); use infer_backend: auto for adapter folders.")
        threads = n_threads or torch.get_num_threads()  # llama-cpp-python's default is half the cores
        self.llm = llama_cpp.Llama(model_path=str(gguf_path), n_ctx=n_ctx, n_threads=threads,
                                   n_threads_batch=threads, lora_path=str(adapters[0]) if adapters else None,
                                   logits_all=False, verbose=False)
        self.n_vocab = self.llm.n_vocab()
        self.max_length = self.llm.n_ctx()
        largest = max(tokenizer.get_vocab().values())
        if largest >= self.n_vocab:
            raise ConfigError(f"The tokenizer's ids go up to {largest} but {Path(gguf_path).name} has "
                              f"{self.n_vocab} tokens: the tokenizer is not this GGUF's.")
        logger.info("llama.cpp engine: %s, %d-token context, %d threads", Path(gguf_path).name, self.max_length,
                    threads)
        self._start()

    def shutdown(self, timeout: float = 30.0) -> None:
        super().shutdown(timeout)
        if not self._thread.is_alive():
            # Freed now: llama-cpp-python's own finalizer fails when it runs during interpreter teardown.
            self.llm.close()

    def _step(self) -> None:
        request = self._current
        if request is None:
            return
        if request.cancelled or len(request.prompt_ids) >= self.max_length:
            self._current = None
            finish(request, "cancelled" if request.cancelled else "length")
            return
        if not request.generated:
            self._prefill(request.prompt_ids)
        else:
            self.llm.eval([request.generated[-1]])
        token = sample_rows([request], self._last_logits())[0]
        request.generated.append(token)
        reason = report_token(request, token, self.tokenizer, self.stop_token_ids)
        if reason is None and self.llm.n_tokens + 1 >= self.max_length:
            reason = "length"
        if reason is not None:
            self._current = None
            finish(request, reason)

    def _prefill(self, prompt: list[int]) -> None:
        """Evaluate the prompt, keeping the cached KV of its longest prefix shared with what is in the
        context (at least one token is evaluated, for its logits)."""
        cached = self.llm.input_ids[:self.llm.n_tokens]
        shared = 0
        for a, b in zip(cached, prompt[:-1]):
            if a != b:
                break
            shared += 1
        self.llm.n_tokens = shared  # eval drops the KV past n_tokens first
        self.llm.eval(prompt[shared:])

    def _last_logits(self) -> torch.Tensor:
        pointer = llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        row = np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), shape=(self.n_vocab,))
        return torch.from_numpy(row.copy())[None]
