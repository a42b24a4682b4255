"""ModelArguments: which model to load, and how (base quantization, attention kernel, inference dtype and backend)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from gym.config.base_quantization import BaseQuantizationArguments
from gym.core.errors import ConfigError

if TYPE_CHECKING:
    from gym.config.args import TrainArgs


@dataclass
class ModelArguments(BaseQuantizationArguments):
    """Which model to load, and how (the base quantization keys come from BaseQuantizationArguments)."""

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
    rope_scaling: Literal["linear", "dynamic", "yarn", "llama3"] | None = field(
        default=None,
        metadata={"help": "Stretch RoPE to a longer context than the model was trained for: linear (positions "
                  "interpolated), dynamic (NTK, grows with the input), yarn or llama3 (frequency-dependent). The "
                  "factor is model_max_length / the model's own context."},
    )
    model_max_length: int | None = field(
        default=None,
        metadata={"help": "The context length to train and serve at, with rope_scaling (default: cutoff_len)."},
    )
    flash_attn: Literal["auto", "sdpa", "eager", "disabled", "fa2", "fa3"] = field(
        default="auto",
        metadata={"help": "Attention kernel: auto (fa2 on a CUDA GPU with flash-attn installed, else sdpa), sdpa "
                  "(torch's fused attention), eager (plain matmuls; 'disabled' is LLaMA-Factory's name for it), fa2 "
                  "(flash-attn 2: CUDA GPU + flash-attn) or fa3 (flash-attn 3: Hopper GPU + flash_attn_interface)."},
    )
    shift_attn: bool = field(
        default=False,
        metadata={"help": "LongLoRA's shifted sparse attention in training (each token attends within a quarter of "
                  "the sequence, half the heads shifted by half a group): long-context training at a quarter of the "
                  "attention cost. Full attention at evaluation and inference."},
    )
    use_unsloth: bool = field(
        default=False,
        metadata={"help": "Load and wrap the model with Unsloth's patched kernels (LoRA/QLoRA on a CUDA GPU with the "
                  "unsloth package)."},
    )
    upcast_layernorm: bool = field(
        default=False,
        metadata={"help": "Keep the norm weights in float32 where the base is loaded in bf16 (LoRA under bf16 mixed "
                  "precision); elsewhere they are float32 already."},
    )
    upcast_lmhead_output: bool = field(
        default=False,
        metadata={"help": "Return the LM head's logits in float32 (the loss upcasts them anyway; this also covers "
                  "what reads the logits directly)."},
    )
    print_param_status: bool = field(
        default=False,
        metadata={"help": "Log every parameter's name, dtype, device and whether it trains, once the model is set "
                  "up for training."},
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

    # Vision and audio inputs (vision-language models; LLaMA-Factory's names and defaults).
    image_max_pixels: int = field(
        default=768 * 768,
        metadata={"help": "Images larger than this many pixels are scaled down (aspect kept) before the processor."},
    )
    image_min_pixels: int = field(
        default=32 * 32, metadata={"help": "Images smaller than this many pixels are scaled up before the processor."}
    )
    video_max_pixels: int = field(default=256 * 256, metadata={"help": "The pixel limit of each video frame."})
    video_min_pixels: int = field(default=16 * 16, metadata={"help": "The smallest size of each video frame."})
    video_fps: float = field(default=2.0, metadata={"help": "Frames sampled per second of video."})
    video_maxlen: int = field(default=128, metadata={"help": "At most this many frames per video."})
    audio_sampling_rate: int = field(default=16000, metadata={"help": "Audio is resampled to this rate."})

    def validate(self, args: TrainArgs[Any]) -> None:
        super().validate(args)
        for key in ("image_max_pixels", "image_min_pixels", "video_max_pixels", "video_min_pixels", "video_maxlen"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"'{key}' must be positive, got {getattr(self, key)}.")
        if self.image_min_pixels > self.image_max_pixels:
            raise ConfigError(f"'image_min_pixels' ({self.image_min_pixels}) is above 'image_max_pixels' "
                              f"({self.image_max_pixels}).")
        if self.video_fps <= 0:
            raise ConfigError(f"'video_fps' must be positive, got {self.video_fps}.")
        if self.shift_attn:
            if self.flash_attn not in ("auto", "sdpa"):
                raise ConfigError(f"'shift_attn' is its own attention kernel (sdpa within groups); it cannot run with "
                                  f"flash_attn: {self.flash_attn}. Leave flash_attn at auto.")
            if args.data.packing or args.data.neat_packing:
                raise ConfigError("'shift_attn' attends within groups of each row and cannot keep packed samples "
                                  "apart; turn packing off.")
        if self.upcast_layernorm and args.training.pure_bf16:
            raise ConfigError("'upcast_layernorm' keeps norms in float32 under autocast; pure_bf16 runs without "
                              "autocast, where a float32 norm would feed float32 into bf16 layers. Keep one.")
        if self.use_unsloth:
            variants = [k for k in ("use_dora", "pissa_init", "loftq_init") if getattr(args.finetuning, k)]
            if args.finetuning.finetuning_type not in ("lora", "full") or self.shift_attn or variants:
                raise ConfigError("'use_unsloth' covers plain LoRA/QLoRA and full fine-tuning (no OFT, DoRA, PiSSA, "
                                  "LoftQ or shift_attn).")

    def check_environment(self, args: TrainArgs[Any]) -> None:
        """What this machine must have for the kernels asked for; checked when a run starts (a config object
        can be written anywhere, e.g. on a laptop for a GPU box)."""
        local = Path(self.model_name_or_path or "").expanduser()
        if self.model_revision != "main" and self.model_name_or_path and (local.is_dir() or local.suffix == ".gguf"):
            # transformers ignores a revision for a local folder: the run would load whatever the folder holds
            raise ConfigError(f"'model_revision: {self.model_revision}' picks a branch, tag or commit of a hub model; "
                              f"{self.model_name_or_path} is a local {'file' if local.suffix == '.gguf' else 'folder'}"
                              ", which has none. Remove it, or name the hub model.")
        if self.flash_attn not in ("fa2", "fa3") and not self.use_unsloth:
            return  # nothing machine-specific asked for: no torch import just to read a config
        import torch

        cuda = torch.cuda.is_available()
        if self.flash_attn in ("fa2", "fa3"):
            package = "flash_attn" if self.flash_attn == "fa2" else "flash_attn_interface"
            if not cuda:
                raise ConfigError(f"flash_attn: {self.flash_attn} needs a CUDA GPU, and this machine has none; use "
                                  "flash_attn: auto (sdpa here).")
            if self.flash_attn == "fa3" and torch.cuda.get_device_capability()[0] < 9:
                raise ConfigError("flash_attn: fa3 needs a Hopper GPU (compute capability 9.0 or later); use fa2.")
            if importlib.util.find_spec(package) is None:
                pip_name = "flash-attn" if self.flash_attn == "fa2" else "flash-attn-3 (flash-attention's hopper/)"
                raise ConfigError(f"flash_attn: {self.flash_attn} needs the {package} package: pip install {pip_name}.")
        if self.use_unsloth:
            if not cuda:
                raise ConfigError("'use_unsloth' needs a CUDA GPU (Unsloth's kernels are Triton), and this machine has "
                                  "none; leave it off here.")
            if importlib.util.find_spec("unsloth") is None:
                raise ConfigError("'use_unsloth' needs the unsloth package: pip install unsloth.")
