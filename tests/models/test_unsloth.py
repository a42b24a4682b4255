"""use_unsloth maps Gym's settings onto Unsloth's documented FastLanguageModel API. Unsloth needs a CUDA GPU, so
here a stand-in records the calls: what is tested is Gym's side of the contract (which arguments, which path)."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from gym.config.finetuning import FinetuningArguments
from gym.config.model import ModelArguments
from gym.models import adapters, loader, unsloth


@pytest.fixture()
def fake_unsloth(monkeypatch):
    calls: dict = {}

    class FastLanguageModel:
        @staticmethod
        def from_pretrained(**kwargs):
            calls["load"] = kwargs
            return torch.nn.Linear(2, 2), object()

        @staticmethod
        def get_peft_model(model, **kwargs):
            calls["peft"] = kwargs
            return model

    monkeypatch.setitem(sys.modules, "unsloth", types.SimpleNamespace(FastLanguageModel=FastLanguageModel))
    return calls


def test_qlora_through_unsloth(fake_unsloth):
    model_args = ModelArguments(use_unsloth=True, quantization_bit=4, model_max_length=4096)
    model = loader.load_causal_lm("/models/x", model_args, dtype=torch.bfloat16)
    assert unsloth.is_unsloth(model)
    assert fake_unsloth["load"] == {"model_name": "/models/x", "max_seq_length": 4096, "dtype": torch.bfloat16,
                                    "load_in_4bit": True, "load_in_8bit": False, "trust_remote_code": False}
    adapters.setup_finetuning(model, FinetuningArguments(lora_rank=16, lora_target="q_proj,v_proj", lora_dropout=0.1))
    assert fake_unsloth["peft"] == {"r": 16, "lora_alpha": 32, "lora_dropout": 0.1,
                                    "target_modules": ["q_proj", "v_proj"], "use_rslora": False,
                                    "use_gradient_checkpointing": "unsloth", "random_state": 0}


def test_all_targets_name_every_projection(fake_unsloth):
    model = unsloth.load("/models/x", ModelArguments(use_unsloth=True), torch.float32)
    adapters.setup_finetuning(model, FinetuningArguments())
    assert fake_unsloth["peft"]["target_modules"] == unsloth.LINEAR_MODULES
    assert fake_unsloth["load"]["load_in_4bit"] is False
