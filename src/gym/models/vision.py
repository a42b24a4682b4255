"""Vision-language (and audio-language) models: telling one from a text model, loading it with its processor,
and choosing which of its parts train.

Any model transformers loads with `AutoModelForImageTextToText` (LLaVA, LLaVA-NeXT, Qwen2/2.5/3-VL, Idefics3,
SmolVLM, Gemma 3, PaliGemma, ...) or `AutoModelForMultimodalLM` (Qwen2-Audio, Qwen2.5-Omni) is one. The model's own
processor does the family-specific work: it expands each placeholder into the right number of media tokens and
turns pixels (or audio) into the tensors the model takes. What Gym adds is the glue LLaMA-Factory's mm_plugin
keeps per family: which text a row's `<image>` becomes before the processor sees it, and which modules are the
vision tower, the projector and the language model, so that the `freeze_*` keys mean the same on every family.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError

from gym.config.finetuning import FinetuningArguments
from gym.config.model import ModelArguments
from gym.core.errors import ConfigError, ModelError

logger = logging.getLogger(__name__)

# Module names, as the families in transformers 5 spell them. A parameter belongs to the first part whose name
# appears as a whole component of its path; everything else is the language model (embeddings and head included).
# Qwen-VL keeps its projector (`merger`) inside the vision tower (`visual`), so projectors are matched first.
PROJECTOR_NAMES = ("multi_modal_projector", "merger", "connector", "mm_projector", "audio_projector",
                   "embed_vision", "embed_audio")
ENCODER_NAMES = ("vision_tower", "visual", "vision_model", "audio_tower", "vision_encoder", "audio_model",
                 "audio_encoder")
PARTS = ("projector", "encoder", "language")

def _mappings() -> tuple[dict[str, str], dict[str, str]]:
    from transformers.models.auto import modeling_auto

    return (modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
            modeling_auto.MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES)


def model_type_of(model_path: str, model_args: ModelArguments | None = None) -> str | None:
    """The config's model_type, or None when the folder has no readable config (an adapter, a broken folder)."""
    local = Path(model_path) / "config.json"
    if local.is_file():
        # Read as text: transformers' config classes import its model-loading code (~1 s of a chat's start).
        try:
            found = json.loads(local.read_text()).get("model_type")
        except (OSError, ValueError, AttributeError):
            found = None
        if isinstance(found, str):
            return found
    from transformers import AutoConfig

    from gym.models.loader import _hub_kwargs

    try:
        return str(AutoConfig.from_pretrained(model_path, **_hub_kwargs(model_args)).model_type)
    except (OSError, ValueError, KeyError):
        return None


# Text-only families, answered without importing transformers' model mappings (~0.1-0.4 s of a chat's start).
TEXT_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "gpt2", "phi3", "gemma", "gemma2"})


def is_multimodal_type(model_type: str | None) -> bool:
    if model_type in TEXT_TYPES:
        return False
    image_text, multimodal = _mappings()
    return model_type is not None and (model_type in image_text or model_type in multimodal)


def is_multimodal(model_path: str, model_args: ModelArguments | None = None) -> bool:
    """Whether the model takes images, videos or audio (loads through the processor and a multimodal auto class)."""
    return is_multimodal_type(model_type_of(model_path, model_args))


def is_multimodal_model(model: Any) -> bool:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return is_multimodal_type(getattr(base.config, "model_type", None))


def load_processor(model_path: str, model_args: ModelArguments | None = None) -> Any:
    """The model's processor (tokenizer + image/video/audio processors), padding with EOS when it has no pad."""
    from transformers import AutoProcessor

    from gym.models.loader import _first_line, _hub_kwargs

    try:
        processor = AutoProcessor.from_pretrained(model_path, **_hub_kwargs(model_args))
    except (OSError, ValueError, AttributeError, ImportError) as exc:
        text = _first_line(exc)
        if "VIDEO_PROCESSOR_MAPPING" in text or "torchvision" in text.lower():
            text = ("its processor needs torchvision (transformers builds video processors on it): install the "
                    "torchvision build that matches your torch")
        raise ModelError(f"Could not load the processor of {model_path}: {text}. A vision-language model folder "
                         "needs its processor files (preprocessor_config.json, processor_config.json).") from None
    tokenizer = getattr(processor, "tokenizer", None)
    if tokenizer is None:
        raise ModelError(f"The processor of {model_path} has no tokenizer; Gym needs one to render conversations.")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return processor


def load_multimodal(model_path: str, model_args: ModelArguments | None = None,
                    dtype: torch.dtype = torch.float32) -> Any:
    """The model with its vision/audio parts, through the auto class transformers registers its type under."""
    from transformers import AutoModelForImageTextToText, AutoModelForMultimodalLM

    from gym.models.loader import _load_kwargs, _report_quantized, attn_implementation, load_failed

    image_text, _ = _mappings()
    auto = AutoModelForImageTextToText if model_type_of(model_path, model_args) in image_text \
        else AutoModelForMultimodalLM
    try:
        model = auto.from_pretrained(model_path, dtype=dtype, attn_implementation=attn_implementation(model_args),
                                     **_load_kwargs(model_path, model_args, dtype))
    except (OSError, ValueError, SafetensorError) as exc:
        raise load_failed(model_path, exc) from None
    _report_quantized(model, model_args, dtype)
    return model


def part_of(parameter_name: str) -> str:
    """projector, encoder (vision or audio tower) or language, by the parameter's module path."""
    components = set(parameter_name.split("."))
    if components.intersection(PROJECTOR_NAMES):
        return "projector"
    if components.intersection(ENCODER_NAMES):
        return "encoder"
    return "language"


def frozen_parts(args: FinetuningArguments) -> set[str]:
    frozen = {part for part, key in (("encoder", "freeze_vision_tower"), ("projector", "freeze_multi_modal_projector"),
                                     ("language", "freeze_language_model")) if getattr(args, key)}
    if frozen == set(PARTS):
        raise ConfigError("freeze_vision_tower, freeze_multi_modal_projector and freeze_language_model are all true: "
                          "nothing would train. Set one of them to false.")
    return frozen


def adapter_targets(model: Any, args: FinetuningArguments, targets: list[str]) -> tuple[str, list[str]]:
    """LoRA/OFT on a multimodal model: a regex (peft matches a string as a full-name regex) for the linear layers
    of the parts that train, and the modules trained in full beside the adapter (an unfrozen projector).

    `targets` are the user's module names (`["all"]`: every linear layer but the output head, peft's all-linear)."""
    frozen = frozen_parts(args)
    output = model.get_output_embeddings()
    chosen: set[str] = set()
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or module is output:
            continue
        part = part_of(name)
        leaf = name.rsplit(".", 1)[-1]
        if part == "projector" or part in frozen:
            continue
        if targets == ["all"] or leaf in targets:
            chosen.add(name)
    if not chosen:
        raise ConfigError(f"lora_target={','.join(targets)} matched no linear layer in the parts that train "
                          f"(frozen: {', '.join(sorted(frozen))}); use 'all' or the module names of the language "
                          "model (e.g. q_proj,v_proj).")
    pattern = "^(?:" + "|".join(re.escape(n) for n in sorted(chosen)) + ")$"
    projectors = sorted({_part_root(n, "projector") for n, _ in model.named_parameters() if part_of(n) == "projector"})
    return pattern, ([] if "projector" in frozen else projectors)


def _part_root(parameter_name: str, part: str) -> str:
    names = PROJECTOR_NAMES if part == "projector" else ENCODER_NAMES
    components = parameter_name.split(".")
    for i, component in enumerate(components):
        if component in names:
            return ".".join(components[: i + 1])
    return parameter_name


def freeze_parts(model: Any, args: FinetuningArguments) -> None:
    """full/freeze fine-tuning of a multimodal model: the frozen parts' parameters stop training."""
    frozen = frozen_parts(args)
    for name, param in model.named_parameters():
        if part_of(name) in frozen:
            param.requires_grad_(False)
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError("No parameter of the model trains: the freeze_* keys froze every part that the "
                          "finetuning_type would train.")
