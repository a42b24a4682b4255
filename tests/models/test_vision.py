"""Which parts of each vision/audio family the freeze keys mean (issue #41), checked on the real transformers classes
(built on the meta device from their default configs, so no weights and no processors are needed): the tables in
gym.models.vision name every family's tower, projector and language model the way LLaMA-Factory's do."""

from __future__ import annotations

import re

import pytest
import torch

from gym.config.finetuning import FinetuningArguments
from gym.core.errors import ConfigError
from gym.models import vision

# family -> (the module(s) the encoders live under, the projector's module, the language model's module)
FAMILIES = {
    "llava": ("model.vision_tower", "model.multi_modal_projector", "model.language_model"),
    "llava_next": ("model.vision_tower", "model.multi_modal_projector", "model.language_model"),
    "llava_onevision": ("model.vision_tower", "model.multi_modal_projector", "model.language_model"),
    "qwen2_vl": ("model.visual", "model.visual.merger", "model.language_model"),
    "qwen2_5_vl": ("model.visual", "model.visual.merger", "model.language_model"),
    "qwen3_vl": ("model.visual", "model.visual.merger", "model.language_model"),
    "idefics3": ("model.vision_model", "model.connector", "model.text_model"),
    "smolvlm": ("model.vision_model", "model.connector", "model.text_model"),
    "gemma3": ("model.vision_tower", "model.multi_modal_projector", "model.language_model"),
    "paligemma": ("model.vision_tower", "model.multi_modal_projector", "model.language_model"),
    "qwen2_audio": ("model.audio_tower", "model.multi_modal_projector", "model.language_model"),
    "qwen2_5_omni_thinker": (("model.audio_tower", "model.visual"), "model.visual.merger", "model.language_model"),
}


def _meta_model(family: str):
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoModelForMultimodalLM

    config = AutoConfig.for_model(family)
    assert vision.is_multimodal_type(family)
    auto = AutoModelForMultimodalLM if family == "qwen2_audio" else AutoModelForImageTextToText
    with torch.device("meta"):
        return auto.from_config(config)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_familys_parameters_fall_in_the_right_part(family):
    encoder, projector, language = FAMILIES[family]
    encoders = tuple(e + "." for e in ((encoder,) if isinstance(encoder, str) else encoder))
    parts: dict[str, set[str]] = {"encoder": set(), "projector": set(), "language": set()}
    for name, _ in _meta_model(family).named_parameters():
        parts[vision.part_of(name)].add(name)
    assert parts["projector"] and all(n.startswith(projector + ".") for n in parts["projector"])
    assert parts["encoder"] and all(n.startswith(encoders) for n in parts["encoder"])
    assert any(n.startswith(language + ".") for n in parts["language"])
    assert not any(n.startswith((*encoders, projector + ".")) for n in parts["language"])


@pytest.mark.parametrize("family", ["qwen2_vl", "idefics3", "qwen2_audio"])
def test_lora_targets_skip_the_frozen_tower_and_save_an_unfrozen_projector(family):
    model = _meta_model(family)
    encoder, projector, _ = FAMILIES[family]
    assert isinstance(encoder, str)
    pattern, saved = vision.adapter_targets(model, FinetuningArguments(), ["all"])

    linear = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    chosen = [n for n in linear if re.fullmatch(pattern, n)]
    assert chosen and not any(n.startswith((encoder + ".", projector + ".")) for n in chosen)
    assert saved == []
    pattern, saved = vision.adapter_targets(
        model, FinetuningArguments(freeze_vision_tower=False, freeze_multi_modal_projector=False), ["q_proj"])
    chosen = [n for n in linear if re.fullmatch(pattern, n)]
    assert chosen and all(n.endswith("q_proj") for n in chosen)
    assert saved == [projector]


def test_freezing_every_part_is_refused():
    with pytest.raises(ConfigError, match="nothing would train"):
        vision.frozen_parts(FinetuningArguments(freeze_language_model=True))


def test_text_models_are_not_multimodal():
    assert not vision.is_multimodal_type("llama") and not vision.is_multimodal_type(None)
