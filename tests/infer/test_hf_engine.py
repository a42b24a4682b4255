"""The dynamic-batching engine against transformers' own generate, one request at a time."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from gym.infer.hf_engine import HFEngine
from gym.infer.requests import EngineBusy, Finished, Piece, SamplingParams

PROMPTS = ["Hello there, how are", "The capital of France is", "1 2 3 4 5 6 7 8 9 10 11 12", "Once"]


@pytest.fixture(scope="module")
def model_and_tokenizer(embedded_dir):
    """The embedded model, not the tiny random one: a random model's greedy answers barely depend on
    positions or context, so a mis-padded batch would still match its reference."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(embedded_dir).eval(), AutoTokenizer.from_pretrained(embedded_dir)


@pytest.fixture()
def engine(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    engine = HFEngine(model, tokenizer, [tokenizer.eos_token_id], max_batch_size=8, max_waiting=8)
    yield engine
    engine.shutdown()


def reference(model, tokenizer, ids: list[int], new_tokens: int) -> list[int]:
    out = model.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    return out[0, len(ids):].tolist()


def test_requests_joining_a_running_batch_decode_exactly_as_alone(engine, model_and_tokenizer, monkeypatch):
    """Prompts of different lengths arrive while others decode: each joins the batch (left padding, the
    cache padded and stacked) and must produce the token ids greedy generate gives it alone."""
    model, tokenizer = model_and_tokenizer
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    prefills: list[tuple[list[int], dict[int, int]]] = []  # (ids prefilled, {running id: tokens it had by then})
    prefill = engine._prefill

    def watched_prefill(joining):
        prefills.append(([r.id for r in joining], {r.id: len(r.generated) for r in engine._rows}))
        prefill(joining)

    monkeypatch.setattr(engine, "_prefill", watched_prefill)
    requests = []
    for ids in prompts:
        if requests:  # each arrives a few steps into the previous ones
            deadline = time.monotonic() + 60
            while len(requests[-1].generated) < 2 and time.monotonic() < deadline:
                time.sleep(0.005)
        requests.append(engine.submit(ids, SamplingParams(max_new_tokens=16 + 4 * len(requests), do_sample=False)))
    for request in requests:
        assert isinstance(list(request.events())[-1], Finished)

    # One prefill per request, each while every earlier request was still decoding in the batch.
    assert [ids for ids, _ in prefills] == [[r.id] for r in requests]
    for i, (_, running) in enumerate(prefills):
        assert set(running) == {r.id for r in requests[:i]}, (i, running)
        assert i == 0 or running[requests[i - 1].id] >= 2, (i, running)  # the previous one was decoding already
    for ids, request in zip(prompts, requests):
        assert request.generated == reference(model, tokenizer, ids, request.params.max_new_tokens)
        assert len(request.generated) == request.params.max_new_tokens  # no early end: every row stayed to the end


def test_text_and_usage_add_up(engine, model_and_tokenizer):
    _, tokenizer = model_and_tokenizer
    ids = tokenizer.encode(PROMPTS[1])
    events = list(engine.submit(ids, SamplingParams(max_new_tokens=10, do_sample=False)).events())
    done = events[-1]
    assert done.reason == "length" and done.completion_tokens == 10 and done.prompt_tokens == len(ids)
    pieces = [e for e in events if isinstance(e, Piece)]
    assert len(pieces) == 10  # one event per token: streamed, not buffered
    assert "".join(p.text for p in pieces) == done.text == tokenizer.decode(sum((p.token_ids for p in pieces), []),
                                                                            skip_special_tokens=True)


def test_a_seed_samples_the_same_tokens_whatever_shares_the_batch(engine, model_and_tokenizer):
    _, tokenizer = model_and_tokenizer
    params = dict(max_new_tokens=12, do_sample=True, temperature=1.0, top_p=0.95, top_k=0)
    alone = engine.generate(tokenizer.encode(PROMPTS[0]), SamplingParams(seed=11, **params))
    others = [engine.submit(tokenizer.encode(p), SamplingParams(seed=i, **params)) for i, p in enumerate(PROMPTS[1:])]
    crowded = engine.submit(tokenizer.encode(PROMPTS[0]), SamplingParams(seed=11, **params))
    assert list(crowded.events())[-1].text == alone.text
    other = engine.generate(tokenizer.encode(PROMPTS[0]), SamplingParams(seed=12, **params))
    assert other.text != alone.text
    for request in others:
        list(request.events())


def test_stop_strings_end_the_answer_before_them(engine, model_and_tokenizer):
    _, tokenizer = model_and_tokenizer
    ids = tokenizer.encode(PROMPTS[2])
    full = engine.generate(ids, SamplingParams(max_new_tokens=16, do_sample=False)).text
    stop = full[4:7]
    cut = engine.generate(ids, SamplingParams(max_new_tokens=16, do_sample=False, stop=[stop]))
    assert cut.reason == "stop" and cut.text == full[: full.find(stop)]


def test_a_short_request_is_not_stuck_behind_a_long_one(engine, model_and_tokenizer):
    _, tokenizer = model_and_tokenizer
    long = engine.submit(tokenizer.encode(PROMPTS[0]), SamplingParams(max_new_tokens=400, do_sample=False))
    time.sleep(0.05)
    short = engine.generate(tokenizer.encode(PROMPTS[1]), SamplingParams(max_new_tokens=3, do_sample=False))
    assert short.completion_tokens == 3
    assert len(long.generated) < 400  # the long one was still running: they shared steps
    long.cancel()
    assert list(long.events())[-1].reason == "cancelled"


def test_a_full_queue_refuses_instead_of_growing(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    engine = HFEngine(model, tokenizer, [tokenizer.eos_token_id], max_batch_size=1, max_waiting=2)
    try:
        ids = tokenizer.encode(PROMPTS[0])
        running = engine.submit(ids, SamplingParams(max_new_tokens=500, do_sample=False))
        while not running.generated:
            time.sleep(0.01)
        waiting = [engine.submit(ids, SamplingParams(max_new_tokens=2, do_sample=False)) for _ in range(2)]
        with pytest.raises(EngineBusy, match="2 requests are already waiting"):
            engine.submit(ids, SamplingParams(max_new_tokens=2))
        running.cancel()
        assert [list(w.events())[-1].completion_tokens for w in waiting] == [2, 2]  # served once the row freed
    finally:
        engine.shutdown()


def test_shutdown_tells_every_waiting_client(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    engine = HFEngine(model, tokenizer, [tokenizer.eos_token_id], max_batch_size=1, max_waiting=4)
    ids = tokenizer.encode(PROMPTS[0])
    requests = [engine.submit(ids, SamplingParams(max_new_tokens=1000, do_sample=False)) for _ in range(3)]
    results: list[str] = []
    readers = [threading.Thread(target=lambda r=r: results.append(list(r.events())[-1].reason)) for r in requests]
    for reader in readers:
        reader.start()
    engine.shutdown()
    for reader in readers:
        reader.join(10)
    assert sorted(results) == ["cancelled"] * 3
