"""ModelArguments: which model to load, and how (quantization, attention kernel, inference dtype and backend)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from gym.config.quantization import QuantizationArguments


@dataclass
class ModelArguments(QuantizationArguments):
    """Which model to load, and how (the quantization keys come from QuantizationArguments)."""

    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Short name (smollm2-135m, zen-nano, ...), hub id, local folder or .gguf file. "
                  "Default: the embedded SmolLM2-135M-Instruct."},
    )
    adapter_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Comma-separated LoRA adapter folders to load on top of the model."},
    )
    cache_dir: str | None = field(default=None, metadata={"help": "Where hub downloads are cached."})
    model_revision: str = field(default="main", metadata={"help": "Hub branch, tag or commit."})
    hf_hub_token: str | None = field(default=None, metadata={"help": "Token for private hub models."})
    trust_remote_code: bool = field(
        default=False, metadata={"help": "Allow model code from the hub (only for models you trust)."}
    )
    flash_attn: Literal["auto", "disabled", "sdpa", "fa2"] = field(
        default="auto",
        metadata={"help": "Attention kernel: auto (sdpa), disabled (eager), sdpa, or fa2 (flash-attn, GPU only)."},
    )
    infer_dtype: Literal["auto", "float32", "float16", "bfloat16", "int8", "int4"] = field(
        default="auto",
        metadata={"help": "Weights for inference: float32, bfloat16, float16, or int8/int4 (blocks of 32 with a "
                  "scale each; fast engine). auto: int8 on CPU with the fast engine, bf16/fp16 on GPU, else float32."},
    )
    infer_backend: Literal["auto", "fast", "hf", "vllm", "llamacpp"] = field(
        default="auto",
        metadata={"help": "Inference engine: fast (Llama-family models: Gym's CPU kernels, or CUDA graphs on "
                  "a GPU), hf (transformers, any model), vllm (if installed), llamacpp (a GGUF file through "
                  "llama-cpp-python, if installed), or auto (fast where it runs, else hf)."},
    )
    infer_compile: bool = field(
        default=True,
        metadata={"help": "Fast engine on a CUDA GPU: torch.compile the layer step before capturing it as CUDA "
                  "graphs (fused kernels: about twice the single-stream decode speed; ~20 s more start-up, "
                  "less once torch's compile cache is warm). false: eager kernels, start in a second. No "
                  "effect on the CPU, whose kernels are Gym's own."},
    )
    infer_prefill_chunk: int = field(
        default=0,
        metadata={"help": "Fast engine: prompt tokens computed per step, so a long prompt never stalls running "
                  "requests for its whole prefill (0: 256 on the CPU, 2048 on a GPU, where a chunk's time "
                  "hardly depends on its length)."},
    )
    infer_variant_cache_mb: int = field(
        default=256,
        metadata={"help": "Fast engine serving variants: memory for deltas expanded to float matrices (DeltaQuant "
                  "codes; 1-bit signs where the packed kernel cannot run, e.g. on a GPU), least recently used "
                  "dropped first (0: expand on every use)."},
    )
    infer_prefix_cache_mb: int = field(
        default=256,
        metadata={"help": "Fast engine: memory for the KV of prompt prefixes shared across requests (0: off)."},
    )
