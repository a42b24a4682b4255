"""The fast engine's own model reader (gym.infer.fast.direct): the same weights under the same names as transformers
loads, the same rotary tables, the same decoder outputs, and a reason (never a wrong model) for what it cannot read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from gym.infer.fast.cpu import FastDecoder
from gym.infer.fast.decoder import rotary_tables, unsupported_reason
from gym.infer.fast.direct import DirectModel, load_direct
from gym.infer.fast.pack_cache import PackCache

SHAPE = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512)

FAMILIES = {
    "llama-tied": lambda: LlamaForCausalLM(LlamaConfig(**SHAPE, tie_word_embeddings=True, rope_theta=50000.0)),
    "llama-biased": lambda: LlamaForCausalLM(LlamaConfig(**SHAPE, attention_bias=True, mlp_bias=True)),
    "mistral": lambda: MistralForCausalLM(MistralConfig(**SHAPE, sliding_window=128)),
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**SHAPE, rope_theta=1e6)),
    "qwen3": lambda: Qwen3ForCausalLM(Qwen3Config(**SHAPE, head_dim=32)),
}


def _saved(tmp_path: Path, family: str, dtype: torch.dtype = torch.float32) -> Path:
    torch.manual_seed(0)
    model = FAMILIES[family]()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias") or "norm" in name:
                param.normal_(0, 0.5)  # nonzero biases, uneven norms: a dropped or swapped one shows
    folder = tmp_path / family
    model.to(dtype).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_it_reads_each_family_as_transformers_loads_it(tmp_path, family):
    folder = _saved(tmp_path, family)
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    model, reason = load_direct(folder)
    assert reason is None and isinstance(model, DirectModel)
    assert unsupported_reason(model) is None
    ours, theirs = dict(model.named_parameters()), dict(reference.named_parameters())
    assert list(ours) == list(theirs)  # the same names, in the same order (fingerprints, deltas and cache keys)
    assert all(torch.equal(ours[name], theirs[name]) for name in theirs)
    assert [name for name, _ in model.named_modules() if name.endswith("_proj") or name == "lm_head"] == [
        name for name, _ in reference.named_modules() if name.endswith("_proj") or name == "lm_head"]
    for got, expected in zip(rotary_tables(model, 300, torch.device("cpu")),
                             rotary_tables(reference, 300, torch.device("cpu")), strict=True):
        assert torch.equal(got, expected)
    prompt = list(range(5, 40))
    outputs = []
    for source in (model, reference):
        decoder = FastDecoder(source, "float32", slots=1)
        assert decoder.spec == FastDecoder(reference, "float32", slots=1).spec
        logits = decoder.prefill(0, prompt, 0, every_position=True)
        outputs.append((logits, decoder.decode([prompt[-1]], [len(prompt)])))
    assert torch.equal(outputs[0][0], outputs[1][0]) and torch.equal(outputs[0][1], outputs[1][1])


def test_bfloat16_files_load_in_the_asked_dtype_as_transformers_converts_them(tmp_path):
    folder = _saved(tmp_path, "qwen3", torch.bfloat16)
    model, _ = load_direct(folder, torch.float32)
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert model is not None and model.dtype == torch.float32
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), reference.parameters(), strict=True))


def test_writing_a_weight_changes_this_process_copy_never_the_file(tmp_path):
    folder = _saved(tmp_path, "llama-tied")
    model, _ = load_direct(folder)
    assert model is not None
    weight = model.model.layers[0].mlp.down_proj.weight
    with torch.no_grad():
        weight.add_(1.0)  # what applying a delta in place does
    on_disk = load_file(folder / "model.safetensors")["model.layers.0.mlp.down_proj.weight"]
    assert torch.equal(weight, on_disk + 1.0)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied: one parameter, as transformers ties them


def test_a_cache_packed_from_transformers_model_is_found_from_the_direct_one(tmp_path):
    """The packed-weight cache keys products by module names and sampled values: both loaders give the same."""
    folder = _saved(tmp_path, "llama-tied")
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    first = PackCache(folder, "int8")
    FastDecoder(reference, "int8", slots=1, packed=first)
    assert first.hits == 0 and first.save() is not None
    model, _ = load_direct(folder)
    again = PackCache(folder, "int8")
    FastDecoder(model, "int8", slots=1, packed=again)
    assert again.packed == 0 and again.hits == 2 * 4 + 1  # every product of both layers, and the head ("lm_head")


def _edit_config(folder: Path, **changes: object) -> None:
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(("family", "changes", "reason"), [
    ("llama-tied", {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 5e5,
                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 256}}, "RoPE type 'llama3'"),
    ("llama-tied", {"model_type": "gemma"}, "model type 'gemma'"),
    ("llama-tied", {"rms_norm_eps": None}, "leaves out rms_norm_eps"),
    ("qwen3", {"head_dim": None}, "Qwen3's default is 128"),
    ("mistral", {"sliding_window": None}, "Mistral's default is 4096"),
    ("llama-tied", {"auto_map": {"AutoModelForCausalLM": "x.Y"}}, "its own modeling code"),
    ("llama-tied", {"tie_word_embeddings": False}, "no lm_head.weight"),
    ("llama-biased", {"attention_bias": False}, "does not use (model.layers.0.self_attn.k_proj.bias"),
])
def test_what_it_does_not_read_exactly_is_left_to_transformers_with_why(tmp_path, family, changes, reason):
    folder = _saved(tmp_path, family)
    _edit_config(folder, **changes)
    model, why = load_direct(folder)
    assert model is None and reason in (why or "")


def test_a_chat_on_the_fast_engine_imports_no_transformers_model_code(tiny_model_dir):
    """What keeps `gym chat`'s start short (issue #43): the model, its tokenizer and the fast engine come up without
    transformers' modeling code (~2 s of imports), the answer is the one the transformers-loaded model gives, and
    `ChatModel.model` is still transformers' model, loaded when first asked for."""
    script = f"""
import os, sys
from gym.infer.chat import ChatModel
config = {{"model_name_or_path": {str(tiny_model_dir)!r}, "do_sample": False, "max_new_tokens": 6}}
direct = ChatModel(config)
answer = direct.chat([{{"role": "user", "content": "Hi"}}])
print("transformers.modeling_utils" in sys.modules, direct.model_config.num_hidden_layers)
print(type(direct.model).__name__)
os.environ["GYM_DIRECT_LOAD"] = "0"
loaded = ChatModel(config)
print(loaded.chat([{{"role": "user", "content": "Hi"}}]) == answer, len(answer) > 0)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:3] == ["False 2", "LlamaForCausalLM", "True True"]
