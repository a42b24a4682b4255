"""K-quants written by Gym (gym.export.kquants), read back by the gguf package's own K-quant dequantizers; and the
_M mixes' choice of type per tensor."""

from __future__ import annotations

import logging
from collections import Counter

import gguf
import numpy as np
import pytest
import torch

from gym.cli import main
from gym.export.gguf_file import _more_bits, mix_type
from gym.export.kquants import quantize_k

Q = gguf.GGMLQuantizationType


def _rel_rmse(kind: str, x: np.ndarray) -> float:
    if kind in ("Q4_K", "Q5_K", "Q6_K"):
        data = quantize_k(x, kind)
    else:
        data = gguf.quants.quantize(x, Q[kind])
    back = gguf.quants.dequantize(data, Q[kind]).reshape(x.shape)
    return float(np.sqrt(((back - x) ** 2).mean() / (x ** 2).mean()))


# Relative RMS error measured on this data: Q4_K 0.090 (Q4_0 0.138), Q5_K 0.046 (Q5_0 0.070), Q6_K 0.026 (Q5_1 0.047).
@pytest.mark.parametrize(("kind", "legacy", "bound"), [("Q4_K", "Q4_0", 0.095), ("Q5_K", "Q5_0", 0.05),
                                                       ("Q6_K", "Q5_1", 0.03)])
def test_k_quants_read_back_by_gguf_and_beat_the_legacy_type(kind, legacy, bound):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((32, 1024)) * 0.02).astype(np.float32)
    x[:, 5::97] *= 8  # outliers, as trained weights have
    error = _rel_rmse(kind, x)
    assert error < bound and error < _rel_rmse(legacy, x)


def test_sizes_zero_blocks_and_exact_codes():
    x = np.zeros((2, 512), dtype=np.float32)
    x[1, 256:] = np.tile(np.arange(16, dtype=np.float32) * 0.5, 16)  # exactly a 4-bit affine code
    # Q4_K/Q5_K find that code (off only by the fp16 rounding of the super-scale); Q6_K's code is symmetric, so a
    # ramp of positive values gets half its 64 levels: at most half a step (7.5 / 32 / 2) off.
    for kind, nbytes, tolerance in (("Q4_K", 144, 0.002), ("Q5_K", 176, 0.002), ("Q6_K", 210, 7.5 / 64 * 1.01)):
        data = quantize_k(x, kind)
        assert data.shape == (2, 2 * nbytes) and data.dtype == np.uint8
        back = gguf.quants.dequantize(data, Q[kind]).reshape(x.shape)
        assert np.array_equal(back[0], x[0])  # zeros stay exactly zero
        assert np.abs(back[1] - x[1]).max() < tolerance
    with pytest.raises(ValueError, match="multiple of 256"):
        quantize_k(np.zeros((1, 576), dtype=np.float32), "Q4_K")


def test_more_bits_layers_match_llama_quantize():
    assert [i for i in range(30) if _more_bits(i, 30)] == [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29]
    assert [i for i in range(24) if _more_bits(i, 24)] == [0, 1, 2, 5, 8, 11, 14, 17, 20, 21, 22, 23]


def test_mix_types_per_tensor():
    # rows of 1024: K types fit
    assert mix_type("q4_k_m", "token_embd.weight", 1024, 30, tied=True) == Q.Q6_K
    assert mix_type("q4_k_m", "token_embd.weight", 1024, 30, tied=False) == Q.Q4_K
    assert mix_type("q4_k_m", "output.weight", 1024, 30, tied=False) == Q.Q6_K
    assert mix_type("q4_k_m", "blk.2.attn_v.weight", 1024, 30, tied=True) == Q.Q6_K
    assert mix_type("q4_k_m", "blk.3.attn_v.weight", 1024, 30, tied=True) == Q.Q4_K
    assert mix_type("q5_k_m", "blk.5.ffn_down.weight", 1024, 30, tied=True) == Q.Q6_K
    assert mix_type("q5_k_m", "blk.6.ffn_down.weight", 1024, 30, tied=True) == Q.Q5_K
    assert mix_type("q6_k", "blk.3.attn_q.weight", 1024, 30, tied=True) == Q.Q6_K
    # rows of 576 (SmolLM2): llama.cpp's fallbacks
    assert mix_type("q4_k_m", "token_embd.weight", 576, 30, tied=True) == Q.Q8_0
    assert mix_type("q4_k_m", "blk.3.attn_q.weight", 576, 30, tied=True) == Q.Q5_0
    assert mix_type("q5_k_m", "blk.3.attn_q.weight", 576, 30, tied=True) == Q.Q5_1
    assert mix_type("q4_k_m", "blk.2.attn_v.weight", 576, 30, tied=True) == Q.Q8_0


@pytest.mark.parametrize("quantization", ["q4_k_m", "q5_k_m", "q6_k"])
def test_k_quant_file_of_a_model_with_256_wide_rows(tokenizer, tmp_path, quantization):
    """A model whose matrices fill whole super-blocks, so the K types are used; every K tensor dequantized by gguf
    is within its type's error; transformers' GGUF loader reads the q4_k_m file back and its next-token
    distribution stays close to the source's."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    from gym.cli import main
    from gym.models.loader import gguf_parsed_once

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512, num_hidden_layers=8,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id)
    model = LlamaForCausalLM(config)
    folder = tmp_path / "wide"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    out = tmp_path / "out"
    assert main(["export", "--model_name_or_path", str(folder), "--export_dir", str(out), "--format", "gguf",
                 "--quantization", quantization]) == 0
    [path] = out.glob("*.gguf")
    reader = gguf.GGUFReader(path)  # parsed once: its 49,152-token vocabulary takes gguf's reader ~4 s here
    types = {t.name: t.tensor_type for t in reader.tensors}
    default = {"q4_k_m": Q.Q4_K, "q5_k_m": Q.Q5_K, "q6_k": Q.Q6_K}[quantization]
    more = [i for i in range(8) if _more_bits(i, 8)]
    assert types["token_embd.weight"] == Q.Q6_K and types["blk.1.attn_q.weight"] == default
    for i in range(8):
        high = Q.Q6_K if quantization != "q6_k" and i in more else default
        assert types[f"blk.{i}.attn_v.weight"] == high and types[f"blk.{i}.ffn_down.weight"] == high
    # every K tensor, dequantized by gguf, within its type's error (relative RMS; measured 0.072 / 0.036 / 0.018 here)
    from gym.export.gguf_file import permute_for_llama

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 8)
    source = {}
    for hf_name, tensor in model.state_dict().items():
        if hf_name.endswith("q_proj.weight"):
            tensor = permute_for_llama(tensor, 4)
        elif hf_name.endswith("k_proj.weight"):
            tensor = permute_for_llama(tensor, 2)
        source[names.get_name(hf_name, try_suffixes=(".weight", ".bias"))] = tensor.numpy()
    bound = {Q.Q4_K: 0.08, Q.Q5_K: 0.04, Q.Q6_K: 0.02}
    for tensor in reader.tensors:
        if tensor.tensor_type in bound:
            want = source[tensor.name]
            got = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(want.shape)
            error = np.sqrt(((got - want) ** 2).mean() / (want ** 2).mean())
            assert error < bound[tensor.tensor_type], (tensor.name, error)
    if quantization != "q4_k_m":
        return  # transformers' GGUF loader (10 s here) reads one of the three; the checks above cover each type
    with gguf_parsed_once():  # the config's read and the model's: one parse
        rebuilt = AutoModelForCausalLM.from_pretrained(out, gguf_file=path.name, dtype=torch.float32)
    ids = torch.tensor([tokenizer.encode("Once upon a time, in a small village")])
    with torch.no_grad():
        p = torch.softmax(model(ids).logits[0, -1], -1)
        q = torch.softmax(rebuilt(ids).logits[0, -1], -1)
    assert float((p * (p.log() - q.log())).sum()) < 0.05  # KL(source || export) per token, in nats


@pytest.fixture(scope="module")
def narrow_model_dir(tokenizer, tmp_path_factory):
    """A 2-layer Llama 40 wide (its MLP 96): no row fills a 256-value K block, and 40-value rows no 32-value one."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=40, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    path = tmp_path_factory.mktemp("narrow-llama")
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _fallback_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "gym.export.gguf_file" and r.levelno == logging.WARNING]


def test_fallbacks_are_one_warning_per_export_saying_how_many_went_where(narrow_model_dir, tmp_path, caplog):
    # The K fallbacks logged nothing, and each F16 fallback a warning of its own, all alike.
    caplog.set_level(logging.INFO)
    out = tmp_path / "m.gguf"
    assert main(["export", str(narrow_model_dir), "--format", "gguf", "--type", "q4_k_m",
                 "--export_dir", str(out)]) == 0
    [warning] = _fallback_warnings(caplog)
    # Layer 1 (of 2) is one of the _M mix's Q6_K layers for attn_v and ffn_down; the tied embedding is Q6_K too.
    assert warning.startswith("GGUF q4_k_m: 15 tensors are stored in another type than asked, their rows not a "
                              "whole number of its blocks (256 values for a K type, 32 for the other"), warning
    assert warning.endswith(": 11 Q4_K -> F16 (rows of 40); 2 Q6_K -> F16 (rows of 40); 1 Q4_K -> Q5_0 (rows of 96); "
                            "1 Q6_K -> Q8_0 (rows of 96)."), warning
    stored = Counter(t.tensor_type.name for t in gguf.GGUFReader(out).tensors if len(t.shape) == 2)
    assert stored == {"F16": 13, "Q5_0": 1, "Q8_0": 1}  # what the line counts is what the file holds

    caplog.clear()
    assert main(["export", str(narrow_model_dir), "--format", "gguf", "--type", "q8_0", "--export_dir",
                 str(tmp_path / "q8.gguf")]) == 0
    assert _fallback_warnings(caplog) == [
        "GGUF q8_0: 13 tensors are stored in another type than asked, their rows not a whole number of its blocks "
        "(256 values for a K type, 32 for the other quantized types): 13 Q8_0 -> F16 (rows of 40)."]
