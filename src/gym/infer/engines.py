"""`infer_backend` -> an engine. Every engine takes token ids and per-request SamplingParams and reports
Piece/Finished events (gym.infer.requests), so chat, the API, batch inference and Python share one
interface.

To add a backend: a class with `submit`, `load` and `shutdown` (the `Engine` protocol), a value in
ModelArguments.infer_backend, and a branch below.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from gym.config.model import ModelArguments
from gym.core.errors import ConfigError
from gym.infer.hf_engine import HFEngine
from gym.infer.requests import Engine


def build_engine(model_args: ModelArguments, *, model: Any, tokenizer: Any, model_path: str, adapters: list[str],
                 stop_token_ids: list[int], max_batch_size: int = 16, max_waiting: int = 256) -> Engine:
    """The engine for a loaded model (hf) or a model path (vllm, which loads it itself)."""
    backend = model_args.infer_backend
    if backend == "hf":
        return HFEngine(model, tokenizer, stop_token_ids, max_batch_size=max_batch_size, max_waiting=max_waiting)
    if backend == "vllm":
        require_vllm()
        from gym.infer.vllm_engine import VllmEngine  # imports vllm, present only where it is installed

        return VllmEngine(model_path, adapters, stop_token_ids, max_batch_size=max_batch_size,
                          max_waiting=max_waiting, trust_remote_code=model_args.trust_remote_code)
    raise ConfigError(f"infer_backend: {backend!r} is not one of hf, vllm.")


def require_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError("infer_backend: vllm needs the vllm package, which is not installed (pip install vllm; "
                          "it runs on a CUDA GPU). Use infer_backend: hf, which works everywhere.")
