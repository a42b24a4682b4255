from __future__ import annotations

import pytest
import torch

from gym.config.finetuning import FinetuningArguments
from gym.core.errors import ConfigError
from gym.models.adapters import count_parameters, setup_freeze, setup_lora


@pytest.fixture()
def tiny(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


def test_freeze_negative_means_first_layers(tiny):
    setup_freeze(tiny, FinetuningArguments(finetuning_type="freeze", freeze_trainable_layers=-1,
                                           freeze_extra_modules="embed_tokens"))
    trainable = {n for n, p in tiny.named_parameters() if p.requires_grad}
    assert any(n.startswith("model.layers.0.") for n in trainable)
    assert not any(n.startswith("model.layers.1.") for n in trainable)
    assert "model.embed_tokens.weight" in trainable


def test_freeze_bad_values_are_config_errors(tiny):
    with pytest.raises(ConfigError, match="freeze_trainable_layers"):
        setup_freeze(tiny, FinetuningArguments(freeze_trainable_layers=5))
    with pytest.raises(ConfigError, match="matched no parameters"):
        setup_freeze(tiny, FinetuningArguments(freeze_trainable_modules="nonexistent"))


def test_lora_all_targets_every_linear_but_the_head(tiny):
    model = setup_lora(tiny, FinetuningArguments(lora_rank=4))
    wrapped = {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n, _ in model.named_parameters() if "lora_A" in n}
    assert wrapped == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    trainable, total = count_parameters(model)
    assert 0 < trainable < total
    assert all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)


def test_unknown_lora_target_is_a_config_error(tiny):
    with pytest.raises(ConfigError, match="LoRA setup failed"):
        setup_lora(tiny, FinetuningArguments(lora_target="qq_proj"))
