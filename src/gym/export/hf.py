"""`gym export --format hf`: one model folder that any Hugging Face tool loads as it is.

The base with every adapter merged in (LoRA, DoRA, PiSSA as saved by training, OFT/BOFT), or rebuilt
from a delta file, cast to `export_dtype` and saved as safetensors shards of at most `export_size` GB.
The tokenizer goes with it, carrying the chat format the model was trained with: a named Gym template
is written as the equivalent Jinja chat template, so transformers, vLLM and llama.cpp prompt it as Gym
did. generation_config.json holds the decoding settings training saved and the end-of-turn tokens.

An adapter trained on a quantized base (QLoRA) is merged onto the unquantized base: merging into 4-bit
weights would round the adapter away.

A vision-language model (gym.models.vision) loads and saves whole: its vision tower and projector, with the
adapter merged into the language model, and its processor (tokenizer + image processor config) in place of the
tokenizer, so the folder loads with AutoModelForImageTextToText + AutoProcessor. A named template is written so
that the processor's apply_chat_template also takes OpenAI-style content parts (`{"type": "image"}`): each image
part becomes the placeholder the family's processor expands, as Gym's own rows' `<image>` does.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig

from gym.config.parser import get_infer_args
from gym.core.names import split_names
from gym.data.chat_jinja import content_parts_template, jinja_chat_template
from gym.data.multimodal import MediaInputs
from gym.data.templates import ChatFormat, get_chat_format
from gym.delta.apply import apply_delta, save_model_folder
from gym.delta.bitdelta import BitDeltaConfig, BitDeltaQuantizer
from gym.delta.format import load_delta
from gym.delta.weights import merge_adapter
from gym.export.config import ExportArguments
from gym.export.spelling import current_spelling, option
from gym.infer.config import resolve_inference_config
from gym.models import vision
from gym.models.loader import generation_defaults, load_causal_lm, load_tokenizer, resolve_model_path

logger = logging.getLogger(__name__)

_QUANTIZATION_KEYS = ("quantization_bit", "quantization_method", "quantization_type", "double_quantization",
                      "quantization_group_size")
_GENERATION_KEYS = ("do_sample", "temperature", "top_p", "top_k", "repetition_penalty", "max_new_tokens")


def _dtype(choice: str, model_path: str) -> torch.dtype:
    if choice != "auto":
        return getattr(torch, choice)
    saved = getattr(AutoConfig.from_pretrained(model_path), "dtype", None)
    if isinstance(saved, str):
        saved = getattr(torch, saved, None)
    return saved if isinstance(saved, torch.dtype) else torch.float32


@dataclass
class Merged:
    """What every export format starts from."""

    model: Any  # every adapter merged in (or rebuilt from a delta), in eval mode
    tokenizer: Any
    chat: ChatFormat
    decoding: dict[str, Any]  # the decoding settings training saved
    model_path: str  # the base, resolved to a folder
    processor: Any = None  # a vision-language model's processor (None for a text model)
    base_name: str = ""  # the base as the run or the user named it (a short name, a hub id, a folder)
    adapters: list[str] = field(default_factory=list)  # what was merged: a run's adapter too, found from its folder


def load_merged(config: dict[str, Any], delta: str | None = None, bitdelta: bool = False) -> Merged:
    """The model with every adapter merged in, and what prompts it. `bitdelta`: the merged model replaced by base +
    its BitDelta (what a personalized variant of this fine-tune serves)."""
    resolved = resolve_inference_config(config, untrained="refuse", how=current_spelling().untrained)
    # A run's saved config holds every key, the quantization ones at their defaults: only quantization_bit says
    # the base was quantized while it trained (QLoRA).
    trained_bits = resolved.get("quantization_bit")
    for key in _QUANTIZATION_KEYS:
        resolved.pop(key, None)
    if trained_bits is not None:
        logger.info("Merging onto the unquantized base (the adapter was trained on a %s-bit quantized base).",
                    trained_bits)
    model_args, data_args, _, generating = get_infer_args({k: v for k, v in resolved.items() if k != "output_dir"})
    model_path = resolve_model_path(model_args.model_name_or_path)
    processor = None
    if vision.is_multimodal(model_path, model_args):
        processor = vision.load_processor(model_path, model_args)
        tokenizer = processor.tokenizer
        model = vision.load_multimodal(model_path, model_args, dtype=torch.float32)
    else:
        tokenizer = load_tokenizer(model_path, model_args)
        model = load_causal_lm(model_path, model_args, dtype=torch.float32)
    for adapter in split_names(model_args.adapter_name_or_path):
        model = merge_adapter(model, adapter, model_args.model_name_or_path,
                              flag=lambda base: option("model_name_or_path", base))
    if delta is not None:
        entries, header = load_delta(delta)
        apply_delta(model, entries, header, delta)
    if bitdelta:
        model = _as_bitdelta(model, model_path, model_args)
    chat = get_chat_format(tokenizer, data_args.template, data_args.default_system, data_args.enable_thinking,
                           tool_format=data_args.tool_format)
    decoding = generating.resolve(generation_defaults(model_path))
    return Merged(model.eval(), tokenizer, chat, decoding, model_path, processor,
                  base_name=str(model_args.model_name_or_path or model_path),
                  adapters=split_names(model_args.adapter_name_or_path))


def _as_bitdelta(model: Any, model_path: str, model_args: Any) -> Any:
    """base + the 1-bit delta of `model` from it (scales at mean |delta| per row: no distillation data needed)."""
    base = load_causal_lm(model_path, model_args, dtype=torch.float32)
    result = BitDeltaQuantizer(BitDeltaConfig(distill_steps=0)).compress(base, model, base_name=model_path)
    logger.info("BitDelta of the fine-tune: %d changed parameters.", len(result.entries))
    return apply_delta(base, result.entries, result.header).eval()


def export_hf(args: ExportArguments, config: dict[str, Any]) -> Path:
    assert args.export_dir is not None  # ExportArguments requires it
    merged = load_merged(config, args.delta, args.export_type == "bitdelta")
    model, tokenizer, chat, processor = merged.model, merged.tokenizer, merged.chat, merged.processor
    model = model.to(_dtype(args.export_dtype, merged.model_path))
    if chat.template is not None:
        tokenizer.chat_template = jinja_chat_template(chat.template, tokenizer.eos_token or "", chat.default_system,
                                                      chat.enable_thinking, chat.tool_format)
        if processor is not None:
            media = MediaInputs.for_processor(processor, merged.model_path)
            processor.chat_template = tokenizer.chat_template = content_parts_template(tokenizer.chat_template,
                                                                                       media.placeholders)
    generation = model.generation_config
    for key in _GENERATION_KEYS:
        if key in merged.decoding:
            setattr(generation, key, merged.decoding[key])
    generation.eos_token_id = chat.stop_token_ids()
    if generation.pad_token_id is None and tokenizer.pad_token_id is not None:
        generation.pad_token_id = tokenizer.pad_token_id
    manifest = {"made_by": "gym export", "format": "hf", "base_model": merged.base_name,
                "adapters": merged.adapters, "delta": args.delta,
                "chat_template": chat.name, "dtype": str(model.dtype).removeprefix("torch."),
                "type": args.export_type, "processor": type(processor).__name__ if processor is not None else None}
    # A vision-language model's processor saves its tokenizer with it, plus the image processor's settings.
    return save_model_folder(model, processor or tokenizer, args.export_dir, manifest,
                             overwrite=args.export_overwrite, max_shard_size=f"{int(args.export_size * 1000)}MB",
                             how=option("export_overwrite", True))
