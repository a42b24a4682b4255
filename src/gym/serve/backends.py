"""`infer_backend` -> an engine. Every engine takes token ids and per-request SamplingParams and
reports Piece/Finished events to a callback, so `gym chat`, `gym api` and Python share one interface."""

from __future__ import annotations

import importlib.util
from typing import Any

from gym.errors import ConfigError


def build_engine(chat_model: Any, *, max_batch_size: int = 16, max_waiting: int = 256) -> Any:
    """The engine for a loaded ChatModel (its model, tokenizer and end-of-turn tokens)."""
    backend = chat_model.model_args.infer_backend
    stop_ids = chat_model.chat_format.stop_token_ids()
    if backend == "hf":
        from gym.serve.engine import HFEngine

        return HFEngine(chat_model.model, chat_model.tokenizer, stop_ids, max_batch_size=max_batch_size,
                        max_waiting=max_waiting)
    if backend == "vllm":
        require_vllm()
        from gym.serve.vllm_engine import VllmEngine

        return VllmEngine(chat_model.model_path, chat_model.adapters, stop_ids, max_batch_size=max_batch_size,
                          max_waiting=max_waiting, trust_remote_code=chat_model.model_args.trust_remote_code)
    raise ConfigError(f"infer_backend: {backend!r} is not one of hf, vllm.")


def require_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError("infer_backend: vllm needs the vllm package, which is not installed (pip install vllm; "
                          "it runs on a CUDA GPU). Use infer_backend: hf, which works everywhere.")
