"""The fast engine against transformers: same greedy tokens in float32, chunked prefill and prefix-cache
hits equal to one-shot prefill, seeded sampling independent of the batch, and the fallbacks."""

from __future__ import annotations

import threading

import pytest
import torch
from transformers import AutoModelForCausalLM

from gym.config.model import ModelArguments
from gym.core.errors import ConfigError
from gym.infer.engines import build_engine
from gym.infer.fast.cpu import FastDecoder
from gym.infer.fast.decoder import unsupported_reason
from gym.infer.fast.engine import FastEngine
from gym.infer.hf_engine import HFEngine
from gym.infer.requests import SamplingParams

GREEDY = SamplingParams(max_new_tokens=12, do_sample=False, repetition_penalty=1.3)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def reference(model, prompt: list[int], new_tokens: int, penalty: float = 1.3) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, repetition_penalty=penalty, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def prompts(count: int, length: int = 20) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(100, 5000, (length + 3 * i,), generator=g).tolist() for i in range(count)]


def test_float32_greedy_tokens_equal_transformers_generate(tiny, tokenizer):
    engine = FastEngine(tiny, tokenizer, [], dtype="float32", max_batch_size=4)
    try:
        for prompt in prompts(3):
            assert _answer(engine, prompt) == reference(tiny, prompt, 12)
    finally:
        engine.shutdown()


def test_prefill_chunk_zero_is_the_decoders_own_choice(tiny, tokenizer):
    """infer_prefill_chunk's default (0) takes the decoder's chunk: 256 on the CPU (a GPU's is larger,
    gym.infer.fast.gpu); a positive value is kept."""
    assert ModelArguments().infer_prefill_chunk == 0
    for asked, expected in ((0, FastDecoder.prefill_chunk), (7, 7)):
        engine = FastEngine(tiny, tokenizer, [], dtype="float32", prefill_chunk=asked)
        try:
            assert engine.prefill_chunk == expected
        finally:
            engine.shutdown()
    assert FastDecoder.prefill_chunk == 256


def test_concurrent_requests_each_get_their_own_answer(tiny, tokenizer):
    """Rows join and leave a running batch (different prompt and answer lengths) and still decode exactly
    what each would alone."""
    engine = FastEngine(tiny, tokenizer, [], dtype="float32", max_batch_size=3, prefill_chunk=7)
    batch = prompts(6)
    lengths = [5, 12, 8, 3, 12, 9]
    results: dict[int, list[int]] = {}

    def client(i: int) -> None:
        request = engine.submit(batch[i], SamplingParams(max_new_tokens=lengths[i], do_sample=False,
                                                         repetition_penalty=1.3))
        list(request.events())
        results[i] = request.generated

    threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        engine.shutdown()
    for i in range(6):
        assert results[i] == reference(tiny, batch[i], lengths[i]), i


def test_chunked_prefill_gives_the_tokens_of_one_shot_prefill(tiny, tokenizer):
    prompt = prompts(1, length=150)[0]
    answers = []
    for chunk in (1000, 16, 5):
        engine = FastEngine(tiny, tokenizer, [], dtype="float32", prefill_chunk=chunk, prefix_cache_mb=0)
        try:
            answers.append(_answer(engine, prompt))
        finally:
            engine.shutdown()
    assert answers[0] == answers[1] == answers[2] == reference(tiny, prompt, 12)


def test_an_idle_engine_prefills_several_chunks_in_one_step_with_the_same_numbers(tiny, tokenizer):
    """With no request decoding, a long prompt's chunks share one step (one walk through the layers, int8
    weights expanded once); with one decoding, they take a step each so it is not held up. The chunks are
    the same either way, and so is the answer."""
    prompt = prompts(1, length=200)[0]

    def engine_recording_steps() -> tuple[FastEngine, list[list[tuple[int, int]]]]:
        engine = FastEngine(tiny, tokenizer, [], dtype="int8", prefill_chunk=70, prefix_cache_mb=0)
        steps: list[list[tuple[int, int]]] = []
        inner = engine.decoder.prefill_many

        def recording(segments, **options):
            steps.append([(start, len(tokens)) for _, tokens, start in segments])
            return inner(segments, **options)

        engine.decoder.prefill_many = recording
        return engine, steps

    idle, idle_steps = engine_recording_steps()
    try:
        alone = _answer(idle, prompt)
    finally:
        idle.shutdown()
    assert idle_steps == [[(0, 70), (70, 70), (140, 60)]]

    busy, busy_steps = engine_recording_steps()
    try:
        running = busy.submit(prompts(1, length=10)[0], SamplingParams(max_new_tokens=60, do_sample=False))
        events = running.events()
        next(events)  # the first request is decoding
        beside = _answer(busy, prompt)
        list(events)
    finally:
        busy.shutdown()
    assert [(0, 70)] in busy_steps and [(70, 70)] in busy_steps and [(140, 60)] in busy_steps
    assert beside == alone


def _answer(engine, prompt, params=GREEDY) -> list[int]:
    request = engine.submit(prompt, params)
    list(request.events())
    return request.generated


def test_prefix_cache_hits_give_the_tokens_of_misses(tiny, tokenizer):
    system = prompts(1, length=140)[0]  # two whole 64-token blocks shared by both prompts
    first, second = system + [11, 12, 13], system + [21, 22]
    engine = FastEngine(tiny, tokenizer, [], dtype="float32", prefix_cache_mb=64)
    try:
        miss = _answer(engine, first)
        assert engine.prefix.hits == 0
        hit = _answer(engine, second)
        assert engine.prefix.hits == 128
        again = _answer(engine, first)
        assert engine.prefix.hits == 256
    finally:
        engine.shutdown()
    assert miss == again == reference(tiny, first, 12)
    assert hit == reference(tiny, second, 12)


def test_a_seeded_request_samples_the_same_alone_or_in_a_batch(tiny, tokenizer):
    params = SamplingParams(max_new_tokens=10, do_sample=True, temperature=0.9, top_p=0.9, top_k=40, seed=7)
    alone_engine = FastEngine(tiny, tokenizer, [], dtype="float32", max_batch_size=1)
    try:
        alone = _answer(alone_engine, prompts(1)[0], params)
    finally:
        alone_engine.shutdown()
    engine = FastEngine(tiny, tokenizer, [], dtype="float32", max_batch_size=4)
    try:
        others = [engine.submit(p, SamplingParams(max_new_tokens=10, do_sample=True, seed=i))
                  for i, p in enumerate(prompts(4)[1:])]
        mine = engine.submit(prompts(1)[0], params)
        list(mine.events())
        for other in others:
            list(other.events())
    finally:
        engine.shutdown()
    assert mine.generated == alone
    assert len(set(alone)) > 1


def test_answers_stop_at_the_model_length(tiny_model_dir, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    model.config.max_position_embeddings = 40
    engine = FastEngine(model, tokenizer, [], dtype="float32")
    try:
        request = engine.submit(list(range(100, 130)), SamplingParams(max_new_tokens=50, do_sample=False))
        *_, last = request.events()
        too_long = engine.submit(list(range(100, 145)), SamplingParams(max_new_tokens=5, do_sample=False))
        *_, refused = too_long.events()
    finally:
        engine.shutdown()
    assert last.reason == "length" and 30 + len(request.generated) <= 40 and len(request.generated) >= 9
    assert refused.reason == "length" and refused.completion_tokens == 0


@pytest.mark.parametrize("dtype", ["bfloat16", "int8", "int4"])
def test_other_weight_formats_stay_close_to_float32(tiny, dtype):
    prompt = prompts(1, length=40)[0]
    exact = FastDecoder(tiny, "float32", slots=1).prefill(0, prompt, 0, every_position=True)
    served = FastDecoder(tiny, dtype, slots=1).prefill(0, prompt, 0, every_position=True)
    relative = float((served - exact).norm() / exact.norm())
    assert relative < {"bfloat16": 0.02, "int8": 0.02, "int4": 0.15}[dtype]
    assert relative > 0  # it really is a different format


def _tiny_qwen(kind: str):
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    common = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}
    if kind == "qwen3":  # per-head q/k norms, an explicit head_dim
        return Qwen3ForCausalLM(Qwen3Config(**common, head_dim=32)).eval()
    return Qwen2ForCausalLM(Qwen2Config(**common)).eval()  # q/k/v biases


@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_qwen_models_match_transformers_logits(kind):
    model = _tiny_qwen(kind)
    prompt = list(range(3, 40))
    decoder = FastDecoder(model, "float32", slots=2)
    with torch.no_grad():
        expected = model(torch.tensor([prompt])).logits[0]
    assert torch.allclose(decoder.prefill(0, prompt, 0, every_position=True), expected, atol=1e-4)
    # Decoding the last token on top of the rest gives the same logits as the full forward pass.
    decoder.prefill(1, prompt[:-1], 0)
    assert torch.allclose(decoder.decode([prompt[-1], prompt[-1]], [len(prompt) - 1, len(prompt) - 1])[1],
                          expected[-1], atol=1e-4)


def test_auto_falls_back_to_transformers_for_other_architectures(tokenizer, caplog):
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=len(tokenizer))).eval()
    assert "gpt2" in (unsupported_reason(model) or "")
    with caplog.at_level("INFO"):
        engine = build_engine(ModelArguments(), model=model, tokenizer=tokenizer, model_path="x", adapters=[],
                              stop_token_ids=[])
    try:
        assert isinstance(engine, HFEngine)
        assert "gpt2" in caplog.text
    finally:
        engine.shutdown()
    with pytest.raises(ConfigError, match="int8"):
        build_engine(ModelArguments(infer_dtype="int8"), model=model, tokenizer=tokenizer, model_path="x",
                     adapters=[], stop_token_ids=[])
    with pytest.raises(ConfigError, match="fast"):
        build_engine(ModelArguments(infer_backend="fast"), model=model, tokenizer=tokenizer, model_path="x",
                     adapters=[], stop_token_ids=[])


def test_auto_serves_llama_models_with_the_fast_engine(tiny, tokenizer):
    engine = build_engine(ModelArguments(), model=tiny, tokenizer=tokenizer, model_path="x", adapters=[],
                          stop_token_ids=[])
    try:
        assert isinstance(engine, FastEngine)
        assert engine.dtype in ("int8", "float32")
    finally:
        engine.shutdown()


def test_prompts_prefilled_together_equal_prompts_prefilled_alone(tiny):
    """prefill_many runs several prompts' tokens through each weight product at once; each prompt's
    logits and cache are what a prefill of it alone gives (one of them continues an earlier chunk)."""
    first, second, third = prompts(3)
    alone = FastDecoder(tiny, "float32", slots=3)
    together = FastDecoder(tiny, "float32", slots=3)
    expected = [alone.prefill(0, first, 0), alone.prefill(1, second, 0)]
    alone.prefill(2, third[:9], 0)
    expected.append(alone.prefill(2, third[9:], 9))
    together.prefill(2, third[:9], 0)
    got = together.prefill_many([(0, first, 0), (1, second, 0), (2, third[9:], 9)])
    for want, have in zip(expected, got):
        torch.testing.assert_close(have, want, rtol=1e-4, atol=1e-4)
    for slot, length in ((0, len(first)), (1, len(second)), (2, len(third))):
        torch.testing.assert_close(together.keys[1][slot, :, :length], alone.keys[1][slot, :, :length])


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8", "int4"])
def test_the_one_call_decode_step_equals_the_layer_by_layer_one(tiny, kind, dtype):
    """With the kernels built, a decode step of base rows runs every layer in one kernel call
    (kernels.decode_layers). Its logits and cache writes must be exactly those of the layer-by-layer walk
    through the same kernels: q/k norms (qwen3), q/k/v biases (qwen2), every weight format."""
    from gym.infer.fast.kernels import kernel_status

    if kernel_status() is not None:
        pytest.skip(f"the kernels did not build: {kernel_status()}")
    model = tiny if kind == "llama" else _tiny_qwen(kind)
    fused, walked = FastDecoder(model, dtype, slots=3), FastDecoder(model, dtype, slots=3)
    walked.compiled = False  # the layer-by-layer walk (its kernels are still the compiled ones)
    batch = [[token % 500 for token in prompt] for prompt in prompts(3)]  # the qwen models have 512 tokens
    for decoder in (fused, walked):
        for slot, prompt in enumerate(batch):
            decoder.prefill(slot, prompt[:-3], 0)
    for step in range(3):
        tokens = [prompt[-3 + step] for prompt in batch]
        lengths = [len(prompt) - 3 + step for prompt in batch]
        assert torch.equal(fused.decode(tokens, lengths), walked.decode(tokens, lengths))
    for keys, reference in zip(fused.keys, walked.keys):
        for slot, prompt in enumerate(batch):
            assert torch.equal(keys[slot, :, :len(prompt)], reference[slot, :, :len(prompt)])


def test_auto_serves_int8_on_every_cpu_and_says_once_why_it_runs_on_the_reference(monkeypatch, caplog):
    """infer_dtype: auto must not give one machine other numbers than another for the same config: without the
    kernels it is still int8 (on their torch reference), and the reason is said once."""
    from gym.infer import engines
    from gym.infer.fast import kernels

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(engines, "_said_reference", False)
    monkeypatch.setattr(kernels, "_state", {"ok": False, "reason": "no C++ compiler (c++/g++/clang++) on PATH"})
    args = ModelArguments(model_name_or_path="unused", infer_dtype="auto")
    with caplog.at_level("WARNING", logger="gym.infer.engines"):
        assert engines.fast_dtype(args) == "int8" and engines.fast_dtype(args) == "int8"
    said = [r.getMessage() for r in caplog.records if "torch reference" in r.getMessage()]
    assert len(said) == 1 and "no C++ compiler" in said[0] and "infer_dtype: float32" in said[0]
    monkeypatch.setattr(kernels, "_state", {"ok": True, "reason": "", "origin": "prebuilt"})
    assert engines.fast_dtype(args) == "int8"
    assert engines.fast_dtype(ModelArguments(model_name_or_path="unused", infer_dtype="float32")) == "float32"
