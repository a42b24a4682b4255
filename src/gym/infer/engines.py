"""`infer_backend` -> an engine. Every engine takes token ids and per-request SamplingParams and reports
Piece/Finished events (gym.infer.requests), so chat, the API, batch inference and Python share one
interface.

    fast  Gym's engine for Llama-family models (gym.infer.fast): on the CPU its own kernels with
          int8/int4/bf16/fp32 weights; on a CUDA GPU a static cache and CUDA-graph decode steps
    hf    transformers' forward pass with Gym's scheduling (gym.infer.hf_engine): any model, any device
    vllm  vLLM's engine, where it is installed (CUDA)
    llamacpp  a GGUF file through llama-cpp-python, where it is installed (gym.infer.llamacpp_engine)
    auto  fast where it runs, else hf (the reason is logged)

A vision-language model is served by gym.infer.vision_engine (transformers' generate, one request at a time)
under `hf` and `auto`; fast, vllm and llamacpp serve text models only and say so (`multimodal_backend`).

To add a backend: a class with `submit`, `load` and `shutdown` (the `Engine` protocol), a value in
ModelArguments.infer_backend, and a branch below.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import TYPE_CHECKING, Any

import torch

from gym.config.model import ModelArguments
from gym.core.errors import ConfigError
from gym.infer.requests import Engine

if TYPE_CHECKING:
    from gym.infer.fast.bank import VariantSource

logger = logging.getLogger(__name__)

QUANTIZED = ("int8", "int4")


_said_reference = False


def fast_dtype(model_args: ModelArguments) -> str:
    """The weight format the fast engine serves: infer_dtype, with auto -> int8 on every CPU (lossless enough,
    with a quarter of float32's bytes per token; tests/infer/fast/test_quality.py holds it to that). The same
    config gives the same format on every machine: where the kernels are not available, int8 runs on their
    torch reference (slower), and that is said once, with why."""
    if model_args.infer_dtype != "auto":
        return model_args.infer_dtype
    if torch.cuda.is_available():
        return "auto"  # a GPU serves the model in the dtype it was loaded in (bf16 where the GPU has it)
    _say_reference_once(auto=True)
    return "int8"


def _say_reference_once(auto: bool) -> None:
    """Where the kernels are missing, say so once per process, with why (and, under auto, what to set)."""
    global _said_reference
    from gym.infer.fast.kernels import kernel_status

    missing = kernel_status()
    if missing is None or _said_reference:
        return
    _said_reference = True
    if auto:
        logger.warning("infer_dtype: auto serves int8, as on every CPU, but the fast engine's kernels are not "
                       "available here (%s): int8 runs on their torch reference, several times slower. Set "
                       "infer_dtype: float32 for more speed without them, or reinstall Gym with its kernels "
                       "(docs/inference.md).", missing)
    else:
        logger.warning("The fast engine's kernels are not available (%s); it runs their torch reference, slower.",
                       missing)


def fast_unsupported(model: Any) -> str | None:
    from gym.infer.fast.decoder import unsupported_reason

    return unsupported_reason(model)


def multimodal_backend(model_args: ModelArguments, model_path: str) -> None:
    """A vision-language model runs on the transformers engine only: a ConfigError naming the fix for any other
    backend, or an infer_dtype only the fast engine has. Checked before the model loads."""
    backend, dtype = model_args.infer_backend, model_args.infer_dtype
    if backend not in ("auto", "hf"):
        raise ConfigError(f"infer_backend: {backend} serves text models only, and {model_path} is a vision-language "
                          "model. Use infer_backend: hf (or auto, which picks it).")
    if dtype in QUANTIZED:
        raise ConfigError(f"infer_dtype: {dtype} is the fast engine's format, which serves text models only; "
                          f"{model_path} is a vision-language model: use a float infer_dtype (auto, bfloat16, ...).")


def build_engine(model_args: ModelArguments, *, model: Any, tokenizer: Any, model_path: str, adapters: list[str],
                 stop_token_ids: list[int], max_batch_size: int = 16, max_waiting: int = 256,
                 variants: VariantSource | None = None, multimodal: bool = False,
                 weights_folder: str | None = None) -> Engine:
    """The engine for a loaded model (fast, hf), a model path (vllm, which loads it itself) or a GGUF file
    (llamacpp: `model_path` is that file). `variants`: per-user deltas served beside the base (fast only).
    `multimodal`: the model is a vision-language model (gym.infer.vision_engine). `weights_folder`: the folder
    whose safetensors files the model holds unchanged (no adapter, delta or variant merged in), where the fast
    engine caches its packed int8/int4 weights (gym.infer.fast.pack_cache); None packs them at every start."""
    backend = model_args.infer_backend
    if multimodal:
        multimodal_backend(model_args, model_path)
        if variants is not None:
            raise ConfigError("Variants are served by the fast engine, which serves text models only; this is a "
                              "vision-language model.")
        from gym.infer.vision_engine import MultimodalEngine

        logger.info("Serving a vision-language model with transformers' generate, one request at a time.")
        return MultimodalEngine(model, tokenizer, stop_token_ids, max_waiting=max_waiting)
    if variants is not None and backend not in ("auto", "fast"):
        raise ConfigError(f"Variants are served by the fast engine (one base, a delta per row); infer_backend: "
                          f"{backend} cannot. Use infer_backend: auto or fast.")
    if backend == "llamacpp":
        require_llamacpp()
        from gym.infer.llamacpp_engine import LlamaCppEngine  # imports llama_cpp, present only where installed

        return LlamaCppEngine(model_path, tokenizer, stop_token_ids, max_waiting=max_waiting, adapters=adapters)
    if backend in ("auto", "fast"):
        reason = fast_unsupported(model)
        if reason is None:
            return _fast_engine(model_args, model, tokenizer, stop_token_ids, max_batch_size, max_waiting, variants,
                                weights_folder)
        if variants is not None:
            raise ConfigError(f"Variants are served by the fast engine, which cannot serve this model: {reason}.")
        if backend == "fast" or model_args.infer_dtype in QUANTIZED:
            raise ConfigError(f"infer_backend: fast (which infer_dtype {model_args.infer_dtype} needs) cannot serve "
                              f"this model: {reason}. Use infer_backend: hf with a float infer_dtype.")
        logger.info("Serving with the transformers engine: the fast engine cannot, as %s.", reason)
        backend = "hf"
    if backend == "hf":
        if model_args.infer_dtype in QUANTIZED:
            raise ConfigError(f"infer_dtype: {model_args.infer_dtype} runs on the fast engine; set infer_backend: "
                              "fast or auto (or a float infer_dtype for hf).")
        # Imported here: transformers' cache classes, which a start on the fast engine never needs.
        from gym.infer.hf_engine import HFEngine

        return HFEngine(model, tokenizer, stop_token_ids, max_batch_size=max_batch_size, max_waiting=max_waiting)
    if backend == "vllm":
        require_vllm()
        from gym.infer.vllm_engine import VllmEngine  # imports vllm, present only where it is installed

        return VllmEngine(model_path, adapters, stop_token_ids, max_batch_size=max_batch_size,
                          max_waiting=max_waiting, trust_remote_code=model_args.trust_remote_code)
    raise ConfigError(f"infer_backend: {backend!r} is not one of auto, fast, hf, vllm, llamacpp.")


def _fast_engine(model_args: ModelArguments, model: Any, tokenizer: Any, stop_token_ids: list[int],
                 max_batch_size: int, max_waiting: int, variants: VariantSource | None = None,
                 weights_folder: str | None = None) -> Engine:
    """`weights_folder`: the folder whose safetensors files the model holds unchanged, where packed int8/int4
    weights are cached (gym.infer.fast.pack_cache); None packs them at every start."""
    from gym.infer.fast.bank import VariantBank
    from gym.infer.fast.engine import FastEngine
    from gym.infer.fast.pack_cache import PackCache

    dtype = fast_dtype(model_args)
    on_gpu = next(model.parameters()).device.type == "cuda"
    if on_gpu:
        if dtype in QUANTIZED:
            raise ConfigError(f"infer_dtype: {dtype} is the CPU engine's weight format; on a GPU the fast engine "
                              "serves bfloat16/float16/float32 (set infer_dtype: auto or one of those).")
        dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    if not on_gpu:
        _say_reference_once(auto=False)
    logger.info("Fast engine: weights as %s%s.", dtype, " (infer_dtype: auto)" if model_args.infer_dtype == "auto"
                else "")
    return FastEngine(model, tokenizer, stop_token_ids, dtype=dtype, max_batch_size=max_batch_size,
                      max_waiting=max_waiting, prefill_chunk=model_args.infer_prefill_chunk,
                      prefix_cache_mb=model_args.infer_prefix_cache_mb, compile=model_args.infer_compile,
                      variants=None if variants is None else VariantBank(
                          variants, model, cache_mb=model_args.infer_variant_cache_mb),
                      packed=None if on_gpu else PackCache.for_model(weights_folder, dtype))


def require_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError("infer_backend: vllm needs the vllm package, which is not installed (pip install vllm; "
                          "it runs on a CUDA GPU). Use infer_backend: auto, which works everywhere.")


def require_llamacpp() -> None:
    if importlib.util.find_spec("llama_cpp") is None:
        raise ConfigError("infer_backend: llamacpp needs llama-cpp-python, which is not installed (pip install "
                          "'zoo-gym[llamacpp]'; it compiles llama.cpp, several minutes). Use infer_backend: auto, "
                          "which works everywhere.")
