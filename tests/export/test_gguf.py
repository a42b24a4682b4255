"""`gym export --format gguf`: every file opened by real readers. The gguf package's reader and dequantizer check
each tensor against its source within the type's bound; transformers' GGUF loader (an independent reader that
undoes llama.cpp's q/k layout) rebuilds the model with the source's logits and the tokenizer with its ids."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from gym.cli import main
from gym.export.gguf_file import TYPES, permute_for_llama
from gym.models.loader import gguf_parsed_once

TEXTS = ["Hello world!", "  leading spaces, 12345 digits\nand lines", "naïve café — ünïcödé 日本語 🙂",
         "<|im_start|>user\nHi<|im_end|>"]

# Largest error of one dequantized value, as a share of its block's range (max - min) or absolute max: half a
# step, except for q4_0/q5_0, whose scale maps the signed extreme to -8/-16, so values of the other sign clip
# at +7/+15 (up to one step).
BOUNDS = {"q8_0": ("amax", 1 / 254), "q4_0": ("amax", 1 / 8), "q4_1": ("range", 1 / 30), "q5_0": ("amax", 1 / 16),
          "q5_1": ("range", 1 / 62)}


def _export(model_dir, out, quantization, *extra):
    assert main(["export", "--model_name_or_path", str(model_dir), "--export_dir", str(out), "--format", "gguf",
                 "--quantization", quantization, *extra]) == 0
    [path] = out.glob(f"*-{quantization.upper()}.gguf")
    return path


def _source_tensors(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = model.config
    out = {}
    for name, tensor in model.state_dict().items():
        if name.endswith("q_proj.weight"):
            tensor = permute_for_llama(tensor, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            tensor = permute_for_llama(tensor, config.num_key_value_heads)
        out[name] = tensor.numpy()
    return out


@pytest.mark.parametrize("quantization", [t for t in TYPES if "_k" not in t])  # K mixes: test_kquants.py
def test_every_tensor_dequantizes_to_its_source_within_the_types_bound(tiny_model_dir, tmp_path, quantization):
    path = _export(tiny_model_dir, tmp_path, quantization)
    reader = gguf.GGUFReader(path)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
    source = {names.get_name(k, try_suffixes=(".weight", ".bias")): v
              for k, v in _source_tensors(tiny_model_dir).items() if k != "lm_head.weight"}  # tied: token_embd
    assert {t.name for t in reader.tensors} == set(source)
    expected_type = TYPES[quantization][0]
    for tensor in reader.tensors:
        want = source[tensor.name]
        got = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(want.shape)
        if want.ndim == 1:
            assert tensor.tensor_type == gguf.GGMLQuantizationType.F32 and np.array_equal(got, want)
            continue
        assert tensor.tensor_type == expected_type, tensor.name
        if quantization == "f32":
            assert np.array_equal(got, want)
        elif quantization == "f16":
            assert np.array_equal(got, want.astype(np.float16).astype(np.float32))
        elif quantization == "bf16":
            assert np.array_equal(got, torch.from_numpy(want).bfloat16().float().numpy())
        else:
            kind, share = BOUNDS[quantization]
            block = gguf.GGML_QUANT_SIZES[expected_type][0]
            blocks_w, blocks_g = want.reshape(-1, block), got.reshape(-1, block)
            amax = np.abs(blocks_w).max(1)[:, None]
            width = amax if kind == "amax" else np.ptp(blocks_w, 1)[:, None]
            # half a step, plus what storing the block's scale (and minimum) in fp16 can move a value
            assert (np.abs(blocks_g - blocks_w) <= share * width + (width + amax) * 2.0 ** -10 + 1e-7).all(), \
                tensor.name


def test_metadata_tokenizer_and_logits_through_transformers(tiny_model_dir, tmp_path):
    path = _export(tiny_model_dir, tmp_path, "f32")
    with gguf_parsed_once():  # gguf's reader, the tokenizer's config, the tokenizer, the model's: one parse
        _check_metadata_tokenizer_and_logits(tiny_model_dir, path)


def _check_metadata_tokenizer_and_logits(tiny_model_dir: Path, path: Path) -> None:
    reader = gguf.GGUFReader(path)
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    for key in ("general.architecture", "llama.block_count", "llama.context_length", "llama.embedding_length",
                "llama.attention.head_count_kv", "llama.rope.freq_base", "tokenizer.ggml.model",
                "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.eos_token_id",
                "tokenizer.chat_template", "general.file_type"):
        assert key in fields, key
    assert fields["tokenizer.ggml.model"] == "gpt2" and fields["tokenizer.ggml.pre"] == "smollm"
    source_tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert fields["tokenizer.ggml.tokens"][:3] == source_tok.convert_ids_to_tokens([0, 1, 2])
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    for text in TEXTS:
        assert tokenizer.encode(text) == source_tok.encode(text), text
    rebuilt = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    source = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    ids = torch.tensor([source_tok.encode("The capital of France is Paris, and")])
    with torch.no_grad():
        assert torch.allclose(rebuilt(ids).logits, source(ids).logits, atol=1e-5)


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_qwen_models_are_written_without_the_llama_permutation(family, tokenizer, tmp_path):
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    config_cls, model_cls = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM)}[family]
    torch.manual_seed(0)
    # head_dim 128, as every Qwen3: transformers' GGUF reader ignores attention.key_length for qwen3 and assumes it.
    config = config_cls(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=128 if family == "qwen3" else 16,
                        max_position_embeddings=256,
                        tie_word_embeddings=False, eos_token_id=tokenizer.eos_token_id)
    model = model_cls(config)
    with torch.no_grad():  # non-zero biases (qwen2) and norms (qwen3), so that a wrong name would show
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))
    folder = tmp_path / family
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    path = _export(folder, tmp_path / "out", "f32")
    with gguf_parsed_once():
        assert gguf.GGUFReader(path).fields["general.architecture"].contents() == family
        rebuilt = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    ids = torch.tensor([tokenizer.encode("Hello there, general")])
    with torch.no_grad():
        assert torch.allclose(rebuilt(ids).logits, model(ids).logits, atol=1e-5)


def test_named_template_and_bad_choices(trained_run, tmp_path, capsys):
    result = SimpleNamespace(output_dir=str(trained_run))
    path = tmp_path / "model.gguf"
    assert main(["export", "--output_dir", result.output_dir, "--format", "gguf", "--export_dir", str(path)]) == 0
    template = gguf.GGUFReader(path).fields["tokenizer.chat_template"].contents()
    assert "<|start_header_id|>" in template  # the trained llama3 format, not the tokenizer's ChatML
    assert main(["export", "--output_dir", result.output_dir, "--format", "gguf", "--export_dir", str(path)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    # a run named as the model (`--model saves/run`) names the file, not the base its weights start from
    assert main(["export", "--model", str(trained_run), "--format", "gguf", "--export_dir",
                 str(tmp_path / "by-run")]) == 0
    assert [p.name for p in (tmp_path / "by-run").iterdir()] == [f"{trained_run.name}-F16.gguf"]
    assert main(["export", "--output_dir", result.output_dir, "--format", "gguf", "--type", "q4_k_x",
                 "--export_dir", str(tmp_path / "x")]) == 2
    assert "Unknown GGUF type 'q4_k_x'" in capsys.readouterr().err
