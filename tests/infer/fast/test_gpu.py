"""The GPU decoder (gym.infer.fast.gpu) against transformers.

Its arithmetic is checked everywhere: on the CPU it runs the same step eagerly. What needs a CUDA GPU
(graph capture, torch.compile through Triton, the engine on a GPU model) is in the tests marked below;
they are skipped on machines without one (CI's) and run on the GPU machine:
`pytest tests/infer/fast/test_gpu.py` there.
"""

from __future__ import annotations

import threading

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from gym.infer.fast.gpu import GpuDecoder, buckets
from gym.infer.requests import SamplingParams

VOCAB = 512
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (graphs, Triton)")
SHAPE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=1024)


def build(kind: str, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    torch.manual_seed(0)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**SHAPE, tie_word_embeddings=True))
    elif kind == "qwen2":  # biases on q, k and v
        model = Qwen2ForCausalLM(Qwen2Config(**SHAPE))
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.5)
    else:  # q and k norms, head_dim apart from hidden_size / heads
        model = Qwen3ForCausalLM(Qwen3Config(**SHAPE, head_dim=32))
    return model.to(device=device, dtype=dtype).eval()


def word_tokenizer() -> PreTrainedTokenizerFast:
    """A tokenizer with one word per id, so any token a random model samples detokenizes."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    inner = Tokenizer(WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    inner.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=inner, unk_token="w0", pad_token="w0")


def walk(decoder: GpuDecoder, prompt: list[int], split: int, steps: int) -> torch.Tensor:
    """Logits of every position: the prompt prefilled in two chunks into slot 1, then `steps` decode steps
    of the prompt's continuation, batched with a row in slot 0 at another length."""
    first = decoder.prefill(1, prompt[:split], 0, every_position=True)
    second = decoder.prefill(1, prompt[split:-steps], split, every_position=True)
    decoder.prefill(0, prompt[:5], 0)
    rows = []
    for offset, position in enumerate(range(len(prompt) - steps, len(prompt))):
        rows.append(decoder.decode([prompt[offset], prompt[position]], [5 + offset, position])[1])
    return torch.cat([first, second, torch.stack(rows)])


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_prefill_and_batched_decode_match_transformers_logits(kind):
    model = build(kind)
    prompt = torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(2)).tolist()
    with torch.no_grad():
        reference = model(torch.tensor([prompt])).logits[0]
        got = walk(GpuDecoder(model, slots=3), prompt, 17, 6)
    assert (got - reference).abs().max() < 1e-4


def test_padding_rows_write_only_the_scratch_slot():
    """A graph's padding rows must not touch any request's cache: their keys go to the slot past the last."""
    decoder = GpuDecoder(build("llama"), slots=2)
    with torch.no_grad():
        decoder.prefill(1, [3, 4, 5], 0)
        before = [k[:2].clone() for k in decoder.keys]
        decoder._decode_step(torch.tensor([7, 0]), torch.tensor([3, 0]), torch.tensor([0, 2]), 256)
    for old, keys in zip(before, decoder.keys):
        assert torch.equal(old[1], keys[1])  # the padding row (row 1) left slot 1 alone
        assert not torch.equal(old[0], keys[0])  # the real row wrote its position 3
        assert keys[2, :, 0].abs().sum() > 0  # ... and the padding row wrote the scratch slot


def test_prompts_prefilled_together_equal_each_prefilled_alone():
    """prefill_many walks the layers once for every segment: fresh prompts and a later chunk of one, in other
    slots, give each the logits and cache contents of its own prefill."""
    model = build("qwen3")
    g = torch.Generator().manual_seed(4)
    first, second, third = (torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (9, 23, 14))
    alone, together = GpuDecoder(model, slots=4), GpuDecoder(model, slots=4)
    with torch.no_grad():
        alone.prefill(2, third[:6], 0)
        together.prefill(2, third[:6], 0)
        expected = [alone.prefill(0, first, 0, every_position=True), alone.prefill(1, second, 0, every_position=True),
                    alone.prefill(2, third[6:], 6, every_position=True)]
        got = together.prefill_many([(0, first, 0), (1, second, 0), (2, third[6:], 6)], every_position=True)
        lasts = together.prefill_many([(0, first, 0), (1, second, 0), (2, third[6:], 6)])
    for want, have, last in zip(expected, got, lasts):
        assert have.shape == want.shape
        assert (have - want).abs().max() < 1e-5
        assert (last - have[-1]).abs().max() < 1e-5
    for keys, reference in zip(together.keys, alone.keys):
        assert (keys[:3, :, :23] - reference[:3, :, :23]).abs().max() < 1e-5


@pytest.mark.slow
def test_compiled_layer_pieces_serve_every_layer_and_give_the_eager_logits():
    """infer_compile compiles one layer's pieces, not the unrolled model: a model with four times the layers
    compiles no more programs, and the compiled steps give the eager logits (float32, on the CPU here; the
    CUDA test below adds the graphs)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    prompt = torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(6)).tolist()
    programs = []
    for layers in (2, 8):
        torch._dynamo.reset()
        counters.clear()
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(Qwen3Config(**{**SHAPE, "num_hidden_layers": layers}, head_dim=32)).eval()
        compiled = GpuDecoder(model, slots=3, compile=True)
        assert compiled.compiled, compiled.compile_reason
        with torch.no_grad():
            got = walk(compiled, prompt, 17, 6)
            reference = walk(GpuDecoder(model, slots=3), prompt, 17, 6)
        programs.append(counters["stats"]["unique_graphs"])
        assert (got - reference).abs().max() < 1e-4
        assert torch.equal(got.argmax(-1), reference.argmax(-1))
    assert programs[0] == programs[1] > 0


def test_batch_buckets_cover_every_size_up_to_the_slots():
    assert buckets(16) == [1, 2, 4, 8, 16]
    assert buckets(12) == [1, 2, 4, 8, 12]
    assert buckets(1) == [1]
    for slots in range(1, 20):
        assert all(any(b >= rows for b in buckets(slots)) for rows in range(1, slots + 1))


# -- on a CUDA GPU --------------------------------------------------------------------------------------------
def _greedy(decoder: GpuDecoder, prompt: list[int], steps: int) -> list[int]:
    token = int(decoder.prefill(0, prompt, 0).argmax())
    tokens = [token]
    for position in range(len(prompt), len(prompt) + steps - 1):
        token = int(decoder.decode([token], [position])[0].argmax())
        tokens.append(token)
    return tokens


@cuda
def test_compiled_graphs_give_the_greedy_tokens_of_eager_steps_in_float32():
    prompt = torch.randint(0, VOCAB, (30,), generator=torch.Generator().manual_seed(3)).tolist()
    with torch.no_grad():
        eager = _greedy(GpuDecoder(build("qwen3", device="cuda"), slots=4, graphs=False, compile=False), prompt, 40)
        compiled = GpuDecoder(build("qwen3", device="cuda"), slots=4, compile=True)
        assert compiled.use_graphs and compiled.compiled
        assert _greedy(compiled, prompt, 40) == eager
        # Past the first length bucket (256 positions) a new graph is captured for the longer cache.
        long_prompt = (prompt * 9)[:250]
        assert _greedy(compiled, long_prompt, 20) == _greedy(
            GpuDecoder(build("qwen3", device="cuda"), slots=4, graphs=False, compile=False), long_prompt, 20)


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_graph_steps_match_transformers_logits_on_cuda(dtype):
    model = build("qwen3", dtype=dtype, device="cuda")
    prompt = torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(2)).tolist()
    with torch.no_grad():
        reference = model(torch.tensor([prompt], device="cuda")).logits[0].float()
        got = walk(GpuDecoder(model, slots=3), prompt, 17, 6)
    scale = reference.abs().max()
    assert (got - reference).abs().max() / scale < (1e-4 if dtype == torch.float32 else 3e-2)


def _engine(model, **options):
    from gym.infer.fast.engine import FastEngine

    return FastEngine(model, word_tokenizer(), [], **options)


def _answer(engine, prompt: list[int], tokens: int = 12, **params) -> list[int]:
    request = engine.submit(prompt, SamplingParams(max_new_tokens=tokens, **{"do_sample": False, **params}))
    list(request.events())
    return request.generated


@cuda
def test_engine_on_a_gpu_model_answers_as_transformers_generate():
    model = build("llama", device="cuda")
    batch = [torch.randint(0, VOCAB, (20 + 3 * i,), generator=torch.Generator().manual_seed(i)).tolist()
             for i in range(5)]
    with torch.no_grad():
        expected = [model.generate(torch.tensor([p], device="cuda"), max_new_tokens=12, min_new_tokens=12,
                                   do_sample=False, pad_token_id=0)[0, len(p):].tolist() for p in batch]
    engine = _engine(model, max_batch_size=3, prefill_chunk=7)
    results: dict[int, list[int]] = {}

    def client(i: int) -> None:
        results[i] = _answer(engine, batch[i])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(batch))]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert engine.decoder.use_graphs
        # Seeded sampling reproduces on the GPU too.
        sampled = [_answer(engine, batch[0], do_sample=True, temperature=0.9, top_p=0.95, seed=7) for _ in range(2)]
    finally:
        engine.shutdown()
    assert [results[i] for i in range(len(batch))] == expected
    assert sampled[0] == sampled[1]


@cuda
def test_chunked_prefill_and_prefix_hits_give_one_shot_tokens_on_cuda():
    model = build("qwen3", device="cuda")
    prompt = torch.randint(0, VOCAB, (150,), generator=torch.Generator().manual_seed(5)).tolist()
    answers = []
    for chunk, cache_mb in ((1000, 0), (16, 0), (1000, 64)):
        engine = _engine(model, prefill_chunk=chunk, prefix_cache_mb=cache_mb)
        try:
            answers.append(_answer(engine, prompt))
            if cache_mb:  # the second request restores the first 128 positions from the prefix cache
                answers.append(_answer(engine, prompt))
                assert engine.prefix.hits == 128
        finally:
            engine.shutdown()
    assert all(answer == answers[0] for answer in answers)


@cuda
def test_prefill_attention_never_runs_cudnn_which_plans_per_shape():
    """cuDNN's attention builds a plan for each new shape (~0.1-1 s on the H100), which every new prompt
    length paid in its time to first token; prefills of new lengths, fresh and continued, must not use it."""
    from torch.profiler import ProfilerActivity, profile

    decoder = GpuDecoder(build("qwen3", dtype=torch.bfloat16, device="cuda"), slots=2)
    with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        for length in (37, 53):
            decoder.prefill(0, list(range(length)), 0)
            decoder.prefill(0, list(range(9)), length)
        torch.cuda.synchronize()
    kernels = [event.key for event in prof.key_averages()]
    assert kernels and not [name for name in kernels if "cudnn" in name.lower()]


@cuda
def test_the_cpu_weight_formats_are_refused_on_a_gpu_model():
    with pytest.raises(ValueError, match="int8"):
        _engine(build("llama", device="cuda"), dtype="int8")


@cuda
def test_variant_rows_on_cuda_equal_their_merged_model():
    """Per-row deltas on the GPU (1-bit expanded into the cache, a LoRA), with graphs on for the base steps:
    a mixed step's rows equal the merged model's and the base's, and a base-only step still replays a graph."""
    import copy

    from gym.delta.apply import apply_delta
    from gym.delta.bitdelta import BitDeltaConfig, BitDeltaQuantizer
    from gym.delta.format import load_delta
    from gym.infer.fast.deltas import UnpackedCache, compile_variant
    from gym.personalization.loading import deltas_from_file

    base = build("qwen3")
    tuned = copy.deepcopy(base)
    with torch.no_grad():
        for _, param in tuned.named_parameters():
            param.add_(torch.randn_like(param) * 0.05)
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = BitDeltaQuantizer(BitDeltaConfig(distill_steps=0)).compress(base, tuned, progress=False).save(
            f"{folder}/d.safetensors")
        entries, header = load_delta(path)
        merged = apply_delta(copy.deepcopy(base), entries, header, path).cuda()
        deltas = deltas_from_file(path)[0]
    base = base.cuda()
    variant = compile_variant("v", "1", deltas, base, UnpackedCache(256 << 20), "cuda")
    decoder, alone = GpuDecoder(base, slots=4), GpuDecoder(merged, slots=4)
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    for slot, prompt in enumerate(prompts):
        decoder.prefill(slot, prompt, 0, variant=variant if slot == 0 else None)
    alone.prefill(0, prompts[0], 0)
    mixed = decoder.decode([1, 2], [4, 3], [variant, None])
    torch.testing.assert_close(mixed[0], alone.decode([1], [4])[0], atol=2e-3, rtol=1e-3)
    base_only = GpuDecoder(base, slots=4)
    base_only.prefill(0, prompts[1], 0)
    torch.testing.assert_close(mixed[1], base_only.decode([2], [3])[0], atol=2e-3, rtol=1e-3)
    assert decoder.use_graphs
