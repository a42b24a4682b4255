"""An adapter trained on a base of another size is one line naming the tensor and the base it was trained on, exit 2,
from every door that loads one (issue #39's leftover: chat, eval and infer ended in peft's traceback)."""

from __future__ import annotations

import re

import pytest
from tests.gym_cli import assert_one_line_error, gym_here


@pytest.mark.parametrize("verb", [
    ["chat", "--prompt", "Hi"],
    ["eval", "--task", "ppl:tiny_text"],
    ["infer", "--dataset", "tiny_alpaca"],
])
def test_an_adapter_for_another_base_is_one_line_from_every_door(verb, narrow_adapter, tiny_model_dir, data_dir,
                                                                  tmp_path):
    args = [verb[0], "--model_name_or_path", str(tiny_model_dir), "--adapter_name_or_path", str(narrow_adapter),
            "--dataset_dir", str(data_dir), *verb[1:]]
    if verb[0] in ("eval", "infer"):
        args += ["-o", str(tmp_path / "out.json")]
    assert_one_line_error(gym_here(*args), f"The adapter {narrow_adapter} does not fit the base {tiny_model_dir} "
                          "(size mismatch for", "It was trained on")
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize("verb", [["export", "--export_dir", "{tmp}/out"], ["eval", "--task", "ppl:tiny_text"]])
def test_an_adapter_missing_weights_for_modules_of_the_base_is_refused_not_left_at_zero(verb, tiny_model_dir, data_dir,
                                                                                       tmp_path, tokenizer):
    # Trained on a 1-layer model of the same width: on the 2-layer base, peft makes layer 1's LoRA modules, finds no
    # weights for them, warns and leaves them at zero; export then wrote the base unchanged with exit 0.
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    short = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2))
    adapter = tmp_path / "one-layer-adapter"
    get_peft_model(short, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], init_lora_weights=False)
                   ).save_pretrained(adapter)
    args = [verb[0], "--model_name_or_path", str(tiny_model_dir), "--adapter_name_or_path", str(adapter),
            "--dataset_dir", str(data_dir), *(a.format(tmp=tmp_path) for a in verb[1:])]
    if verb[0] == "eval":
        args += ["-o", str(tmp_path / "out.json")]
    assert_one_line_error(gym_here(*args), f"The adapter {adapter} does not fit the base {tiny_model_dir} "
                          "(Missing weights for base_model.model.model.layers.1.self_attn.q_proj.lora_A")
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.json").exists()


def test_what_is_not_an_adapter_is_named_as_what_it_is(tmp_path, tiny_model_dir):
    # Each was "The adapter X does not fit the base ... (Can't find 'adapter_config.json')", however X was wrong.
    from gym.core.errors import ConfigError, ModelError
    from gym.models.adapters import attach_adapter
    from gym.models.loader import resolve_model_path

    delta = tmp_path / "d.safetensors"
    delta.write_bytes(b"x")
    (tmp_path / "empty").mkdir()
    cases = [(tiny_model_dir, "is a model folder, not an adapter (it has no adapter_config.json): pass it as "
                              f"model_name_or_path {tiny_model_dir}"),
             (tmp_path / "nope", "Adapter folder not found"),
             (delta, "is a file (a delta file: apply it with --delta)"),
             (tmp_path / "empty", "holds no adapter_config.json")]
    for folder, message in cases:
        with pytest.raises(ConfigError, match=re.escape(message)):
            attach_adapter(None, folder, "base")
    with pytest.raises(ModelError, match=r"is a file \(a delta file: apply it to its base with --delta\)"):
        resolve_model_path(str(delta))
