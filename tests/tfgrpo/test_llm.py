"""The models TF-GRPO calls: an OpenAI-compatible endpoint (retries, backoff, refusals), the local engine, the
answer cache and the usage report."""

from __future__ import annotations

import logging
import time

import pytest

from gym.tfgrpo.llm import CachedLLM, CallCache, Completion, LLMUnavailable, LocalLLM, OpenAIEndpoint, Usage

from .conftest import ScriptedLLM

HELLO = [{"role": "user", "content": "easy: say 1"}]


def test_endpoint_retries_429_and_5xx_with_exponential_backoff(fake_openai, caplog):
    server = fake_openai(ScriptedLLM(), fail_with=[429, 503, 500])
    endpoint = OpenAIEndpoint(server.base_url, "scripted", "key", max_retries=3, retry_delay=0.05)
    started = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="gym.tfgrpo.llm"):
        answer = endpoint.complete(HELLO, temperature=0.0, max_tokens=8, seed=2)
    elapsed = time.perf_counter() - started
    assert answer.text == "\\boxed{1}" and answer.completion_tokens == 1
    assert server.requests == 4
    assert elapsed >= 0.05 + 0.1 + 0.2  # 0.05 * 2^attempt before each retry
    for line in ("HTTP 429; retrying in 0.05 s (1/3)", "HTTP 503; retrying in 0.10 s (2/3)",
                 "HTTP 500; retrying in 0.20 s (3/3)"):
        assert line in caplog.text


def test_endpoint_gives_up_after_its_retries_and_never_retries_a_refusal(fake_openai):
    server = fake_openai(ScriptedLLM(), fail_with=[503] * 10)
    endpoint = OpenAIEndpoint(server.base_url, "scripted", max_retries=2, retry_delay=0.0)
    with pytest.raises(LLMUnavailable, match="failed 3 times; last: HTTP 503"):
        endpoint.complete(HELLO, temperature=0.0, max_tokens=8)
    assert server.requests == 3
    refusing = fake_openai(ScriptedLLM(), fail_with=[400])
    # The server's message says why (a context exceeded, a model not served): the status alone does not.
    with pytest.raises(LLMUnavailable, match=r"refused the request \(scripted\): HTTP 400 \(scripted 400\)$"):
        OpenAIEndpoint(refusing.base_url, "scripted", max_retries=5, retry_delay=0.0).complete(
            HELLO, temperature=0.0, max_tokens=8)
    assert refusing.requests == 1


def test_unreachable_endpoint_is_a_clear_error():
    endpoint = OpenAIEndpoint("http://127.0.0.1:9/v1", "m", max_retries=1, retry_delay=0.0, timeout=2)
    with pytest.raises(LLMUnavailable, match="127.0.0.1:9/v1 \\(m\\) failed 2 times; last: APIConnectionError"):
        endpoint.complete(HELLO, temperature=0.0, max_tokens=8)


def test_cache_replays_and_survives_a_line_cut_by_a_kill(tmp_path):
    path = tmp_path / "calls.jsonl"
    llm = ScriptedLLM()
    cached = CachedLLM(llm, CallCache(path))
    first = cached.complete(HELLO, temperature=0.7, max_tokens=8, seed=1)
    again = cached.complete(HELLO, temperature=0.7, max_tokens=8, seed=1)
    other_seed = cached.complete(HELLO, temperature=0.7, max_tokens=8, seed=2)
    assert llm.calls["rollout"] == 2 and again.cached and not first.cached and not other_seed.cached
    with path.open("a") as handle:
        handle.write('{"key": "abc", "text": "cut of')  # a kill mid-write
    reloaded = CallCache(path)
    assert len(reloaded.answers) == 2


def test_usage_report_counts_roles_and_prices():
    usage = Usage()
    usage.add("rollout", Completion("x", 1000, 500))
    usage.add("rollout", Completion("x", 1000, 500, cached=True))
    usage.add("summary", Completion("x", 2000, 100))
    assert usage.calls() == 3 and usage.calls("rollout") == 2
    prices = {"rollout": [1.0, 2.0], "updater": [10.0, 20.0]}
    assert usage.cost("rollout", prices) == pytest.approx((2000 * 1 + 1000 * 2) / 1e6)
    assert usage.cost("summary", prices) == pytest.approx((2000 * 10 + 100 * 20) / 1e6)
    report = usage.report(prices)
    assert "rollout" in report and "0.0040" in report and "total" in report


def test_local_engine_answers_reproducibly_with_token_counts(tiny_model_dir):
    llm = LocalLLM.load({"model_name_or_path": str(tiny_model_dir)}, max_batch_size=4)
    try:
        a = llm.complete(HELLO, temperature=0.7, max_tokens=6, seed=3)
        b = llm.complete(HELLO, temperature=0.7, max_tokens=6, seed=3)
        greedy = llm.complete([{"role": "system", "content": "Be brief."}, *HELLO], temperature=0.0, max_tokens=6)
        rendered = llm.chat_model.render(HELLO, "Be brief.")
    finally:
        llm.close()
    assert a.text == b.text
    assert a.prompt_tokens == len(llm.chat_model.render(HELLO)) and 1 <= a.completion_tokens <= 6
    assert greedy.prompt_tokens == len(rendered)  # the system message went into the template's system slot
