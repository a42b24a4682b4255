"""Tiny vision-language models built offline from config: `tiny-llava` and `tiny-gemma3`.

LLaVA's layout (a CLIP vision tower, a two-layer projector, a Llama decoder) at ~3 million parameters, with
random weights and the embedded model's tokenizer plus an `<image>` token. It is not a useful assistant; it is
the smallest real model that exercises the whole multimodal path (processor, placeholder expansion, pixel
collation, frozen tower, LoRA on the decoder, serving), so examples and tests run with no network. A 56x56 image
is 16 patches of 14 pixels and becomes 16 `<image>` tokens (CLIP's class token is dropped by the `default`
feature strategy, hence num_additional_image_tokens=1).

`tiny-gemma3` is Gemma 3's layout (a SigLIP tower, an average-pooling projector, a Gemma 3 decoder) at the same
size: a second family whose processor works differently (it expands a begin-of-image token into a whole image
sequence, and marks image tokens with token_type_ids for bidirectional attention), so the multimodal path is
checked against more than one family's conventions. A 56x56 image becomes 4 soft tokens.

Built once into $GYM_HOME/models/<name> (under a lock, written to a temporary name and renamed), with a fixed
seed, so every machine builds the same weights.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from gym.core.files import FORMAT_VERSION, MANIFEST_FILE, temp_path

logger = logging.getLogger(__name__)

IMAGE_SIZE, PATCH_SIZE = 56, 14
TINY_MODELS = {"tiny-llava": "a ~3M-parameter LLaVA with random weights, built offline (tests and examples)",
               "tiny-gemma3": "a ~3M-parameter Gemma 3 (vision) with random weights, built offline (tests)"}


def build_tiny(name: str, dest: str | os.PathLike[str], tokenizer_path: str) -> Path:
    builders = {"tiny-llava": build_tiny_llava, "tiny-gemma3": build_tiny_gemma3}
    return builders[name](dest, tokenizer_path)


def _save_atomically(dest: Path, model: Any, processor: Any, family: str, seed: int) -> None:
    tmp = temp_path(dest)
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    processor.save_pretrained(tmp)
    manifest = {"what": "tiny-vlm", "family": family, "format_version": FORMAT_VERSION, "seed": seed,
                "parameters": sum(p.numel() for p in model.parameters())}
    (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2))
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)
    logger.info("Built %s (%s parameters).", dest, f"{manifest['parameters']:,}")


def build_tiny_llava(dest: str | os.PathLike[str], tokenizer_path: str, seed: int = 0) -> Path:
    """Write a random tiny LLaVA (model + processor) to `dest`, once."""
    from filelock import FileLock
    from transformers import (
        AutoTokenizer,
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dest) + ".lock"):
        if (dest / MANIFEST_FILE).is_file():
            return dest
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
        image_token_id: Any = tokenizer.convert_tokens_to_ids("<image>")
        vision = CLIPVisionConfig(image_size=IMAGE_SIZE, patch_size=PATCH_SIZE, hidden_size=32, intermediate_size=64,
                                  num_hidden_layers=2, num_attention_heads=2, projection_dim=32)
        text = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                           bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                           pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
        config = LlavaConfig(vision_config=vision, text_config=text, image_token_index=image_token_id,
                             vision_feature_select_strategy="default", vision_feature_layer=-1,
                             tie_word_embeddings=True)
        torch.manual_seed(seed)
        model = LlavaForConditionalGeneration(config)
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        image_processor = CLIPImageProcessor(size={"shortest_edge": IMAGE_SIZE},
                                             crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
        processor = LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=PATCH_SIZE,
                                   vision_feature_select_strategy="default", num_additional_image_tokens=1,
                                   chat_template=tokenizer.chat_template)
        _save_atomically(dest, model, processor, "llava", seed)
    return dest


def build_tiny_gemma3(dest: str | os.PathLike[str], tokenizer_path: str, seed: int = 0) -> Path:
    """Write a random tiny Gemma 3 (model + processor) to `dest`, once."""
    from filelock import FileLock
    from transformers import AutoTokenizer, Gemma3Config, Gemma3ForConditionalGeneration, Gemma3Processor
    from transformers.models.gemma3 import Gemma3ImageProcessor

    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dest) + ".lock"):
        if (dest / MANIFEST_FILE).is_file():
            return dest
        # Gemma 3's processor reads its image markers from the tokenizer's named special tokens.
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_path, extra_special_tokens={
            "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"})
        ids: dict[str, Any] = {name: tokenizer.convert_tokens_to_ids(getattr(tokenizer, name))
                               for name in ("boi_token", "eoi_token", "image_token")}
        config = Gemma3Config(
            text_config={"vocab_size": len(tokenizer), "hidden_size": 64, "intermediate_size": 128,
                         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                         "max_position_embeddings": 1024, "sliding_window": 64,
                         "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
                         "pad_token_id": tokenizer.pad_token_id},
            vision_config={"image_size": IMAGE_SIZE, "patch_size": PATCH_SIZE, "hidden_size": 32,
                           "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2},
            mm_tokens_per_image=4, boi_token_index=ids["boi_token"], eoi_token_index=ids["eoi_token"],
            image_token_index=ids["image_token"])
        torch.manual_seed(seed)
        model = Gemma3ForConditionalGeneration(config)
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        image_processor = Gemma3ImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
        processor = Gemma3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_length=4,
                                    chat_template=tokenizer.chat_template)
        _save_atomically(dest, model, processor, "gemma3", seed)
    return dest
