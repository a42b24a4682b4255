"""A run that does not use DeepSpeed never imports it, even where it is installed; once imported, accelerate sees it
again (gym.core.deepspeed_probe). Each case runs in a fresh interpreter: what a process has imported is the subject."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                reason="the probe matters only where deepspeed is installed")

TRAIN_AND_SAVE = """
import sys, tempfile
import gym
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments
from accelerate.utils import other

model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=2))
with tempfile.TemporaryDirectory() as out:
    trainer = Trainer(model=model, args=TrainingArguments(out, use_cpu=True, report_to="none", max_steps=1),
                      train_dataset=[{"input_ids": torch.arange(8), "labels": torch.arange(8)}])
    trainer.train()
    trainer.save_model(out)
    model.save_pretrained(out)
print("after training and saving:", "deepspeed" in sys.modules, other.is_deepspeed_available())
import deepspeed
print("after importing it:", other.is_deepspeed_available(), other.extract_model_from_parallel(model) is model)
"""


def _run(code: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()


def test_training_and_saving_leave_deepspeed_unimported_until_something_imports_it():
    lines = _run(TRAIN_AND_SAVE)
    assert "after training and saving: False False" in lines
    assert "after importing it: True True" in lines


def test_accelerate_imported_before_gym_is_patched_too():
    lines = _run("import accelerate.utils.other as other; import sys; before = other.is_deepspeed_available(); "
                 "import gym; print(before, other.is_deepspeed_available(), 'deepspeed' in sys.modules)")
    assert lines[-1] == "True False False"  # installed, so accelerate said yes; gym's answer waits for an import
