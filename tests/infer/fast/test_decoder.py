"""The one description of a Llama-family decoder (gym.infer.fast.decoder): what it reads from each family's
config, which models it rules out, and that both decoders hold the same fused products of the same modules."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from gym.infer.fast.cpu import FastDecoder
from gym.infer.fast.decoder import DecoderSpec, unsupported_reason
from gym.infer.fast.deltas import decoder_layout
from gym.infer.fast.gpu import GpuDecoder

SHAPE = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512)


def test_spec_reads_each_familys_config():
    llama = DecoderSpec.from_config(LlamaConfig(**SHAPE, tie_word_embeddings=True, rope_theta=500000.0,
                                                rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                              "original_max_position_embeddings": 256}))
    assert (llama.layers, llama.heads, llama.kv_heads, llama.head_dim) == (2, 4, 2, 16)
    assert (llama.rope_type, llama.rope_theta, llama.tied_embeddings) == ("llama3", 500000.0, True)
    assert llama.max_length(None) == 512 and llama.max_length(100) == 100 and llama.max_length(4096) == 512
    qwen3 = DecoderSpec.from_config(Qwen3Config(**SHAPE, head_dim=32))
    assert qwen3.head_dim == 32 and not qwen3.sliding_layers
    # Mistral attends through a window: the cache never holds more positions than it.
    assert DecoderSpec.from_config(MistralConfig(**SHAPE, sliding_window=128)).max_positions == 128
    assert "qwen3, 2 layers of 4 heads (2 key/value) x 32" in str(qwen3)


@pytest.mark.parametrize(("config", "reason"), [
    (LlamaConfig(**SHAPE, rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "depends on the sequence length"),
    (Qwen2Config(**SHAPE, use_sliding_window=True, sliding_window=64, max_window_layers=0), "sliding-window"),
    (LlamaConfig(**SHAPE, hidden_act="gelu"), "hidden_act 'gelu'"),
])
def test_models_it_cannot_run_are_named_with_the_reason(config, reason):
    model = LlamaForCausalLM(config) if config.model_type == "llama" else Qwen2ForCausalLM(config)
    assert reason in (unsupported_reason(model) or "")


def _biased_llama() -> LlamaForCausalLM:
    """Biases on every projection (attention_bias, mlp_bias), nonzero, so a dropped one shows."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SHAPE, attention_bias=True, mlp_bias=True)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0, 0.5)
    return model


@pytest.mark.parametrize("decoder_kind", ["cpu", "gpu-code"])
def test_biases_on_every_projection_match_transformers(decoder_kind):
    """Each decoder computes every bias the model has (the GPU decoder's code runs eagerly on the CPU here)."""
    model = _biased_llama()
    assert unsupported_reason(model) is None
    prompt = list(range(3, 30))
    with torch.no_grad():
        expected = model(torch.tensor([prompt])).logits[0]
        decoder = FastDecoder(model, "float32", slots=2) if decoder_kind == "cpu" else GpuDecoder(model, slots=2)
        got = decoder.prefill(0, prompt, 0, every_position=True)
        decoder.prefill(1, prompt[:-1], 0)
        step = decoder.decode([prompt[-1], prompt[-1]], [len(prompt) - 1, len(prompt) - 1])[1]
    assert (got - expected).abs().max() < 1e-4
    assert (step - expected[-1]).abs().max() < 1e-4


def test_both_decoders_hold_the_same_products_under_the_deltas_keys():
    """One layout: the CPU and GPU decoders fuse the same modules in the same order, and the per-row deltas
    file their parts under those products' keys."""
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**SHAPE, head_dim=32)).eval()
    cpu, gpu = FastDecoder(model, "float32", slots=1), GpuDecoder(model, slots=1)
    linears, vectors = decoder_layout(model)
    params = dict(model.named_parameters())
    for index, (ours, theirs) in enumerate(zip(cpu.layers, gpu.layers, strict=True)):
        for key in ("qkv", "o", "gate_up", "down"):
            weight = getattr(theirs, key).weight
            assert torch.equal(getattr(ours, key).dense(), weight)
            parts = linears[f"{index}.{key}"]
            assert torch.equal(torch.cat([params[part.param] for part in parts]), weight)
        for key in ("input_norm", "post_norm", "q_norm", "k_norm"):
            assert torch.equal(getattr(ours, key), getattr(theirs, key))
            assert torch.equal(params[vectors[f"{index}.{key}"]], getattr(theirs, key))
    assert torch.equal(cpu.head.dense(), gpu.head.weight)
