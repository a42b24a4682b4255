"""Hostile requests get a 4xx, never a 5xx: seeds past 64 bits, lone surrogates, huge bodies and messages,
clients that hang up mid-stream, and the OpenAPI pages behind the key (raw HTTP on 127.0.0.1)."""

from __future__ import annotations

import http.client
import json
import time
from urllib.parse import urlparse

import pytest

from .test_app import HELLO, KEY, raw, rss_mb


@pytest.fixture(scope="module")
def base_url(serve_app, tiny_chat):
    return serve_app(tiny_chat, "tiny", api_key=KEY)


def _chat(base_url: str, **body: object) -> tuple[int, dict]:
    return raw(base_url, "/v1/chat/completions", json.dumps({"model": "tiny", "messages": HELLO, **body}).encode())


@pytest.mark.parametrize("seed", [2**70, -(2**64), 1180591620717411303424])
def test_a_seed_beyond_64_bits_is_a_400_naming_seed(base_url, seed):
    status, body = _chat(base_url, seed=seed)
    assert status == 400 and body["error"]["param"] == "seed"


def test_the_largest_seed_still_answers(base_url):
    status, body = _chat(base_url, seed=2**63 - 1, n=2, max_tokens=2)
    assert status == 200 and len(body["choices"]) == 2


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "a\ud800b"}]},
     "messages.0.content"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "\udfff"}]}]}, "messages.0.content.0.text"),
    ("/v1/completions", {"model": "tiny", "prompt": "x\ud800"}, "prompt"),
    ("/tokenize", {"prompt": "\ud800"}, "prompt"),
])
def test_a_lone_surrogate_is_a_400_naming_the_field(base_url, path, body, param):
    status, answer = raw(base_url, path, json.dumps(body).encode())  # json.dumps escapes it as \ud800
    assert status == 400, answer
    assert answer["error"]["param"] == param and "surrogate" in answer["error"]["message"]


def test_a_huge_body_is_refused_before_it_is_read_or_tokenized(base_url):
    text = "word " * (1 << 20)  # 5 MB
    before, started = rss_mb(), time.perf_counter()
    status, body = _chat(base_url, messages=[{"role": "user", "content": text}])
    assert status == 413 and body["error"]["code"] == "request_too_large"
    # Never read into memory nor tokenized (which took 4.3 s and +570 MB before the limit existed).
    assert time.perf_counter() - started < 10.0 and rss_mb() - before < 100


def test_a_huge_chunked_body_is_refused_too(base_url):
    url = urlparse(base_url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    connection.putrequest("POST", "/v1/chat/completions")
    connection.putheader("Authorization", f"Bearer {KEY}")
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Transfer-Encoding", "chunked")
    connection.endheaders()
    chunk = b"x" * (1 << 20)
    try:
        for _ in range(6):
            connection.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        connection.send(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server answered and closed while we were still sending: also a refusal
    response = connection.getresponse()
    assert response.status == 413
    connection.close()


def test_a_message_too_long_for_any_context_is_a_400_before_tokenizing(base_url, tiny_chat):
    from gym.serve.limits import CHARS_PER_TOKEN_BOUND

    limit = tiny_chat.model.config.max_position_embeddings * CHARS_PER_TOKEN_BOUND
    status, body = _chat(base_url, messages=[{"role": "user", "content": "a" * (limit + 1)}])
    assert status == 400 and body["error"]["param"] == "messages.0.content"
    assert body["error"]["code"] == "context_length_exceeded"


def test_the_openapi_pages_need_the_key_when_one_is_set(base_url):
    status, _ = raw(base_url, "/openapi.json", key=None)
    assert status == 401
    status, schema = raw(base_url, "/openapi.json")
    assert status == 200 and "/v1/chat/completions" in schema["paths"]
    for page in ("/docs", "/redoc"):
        status, _ = raw(base_url, page)
        assert status == 404  # a browser page cannot send the bearer key, so it is not served


def test_without_a_key_the_docs_are_public(serve_app, tiny_chat):
    open_url = serve_app(tiny_chat, "tiny")
    status, schema = raw(open_url, "/openapi.json", key=None)
    assert status == 200 and schema["info"]["title"] == "Gym"


def test_a_client_that_hangs_up_mid_stream_frees_its_row_within_a_step(base_url, tiny_chat):
    url = urlparse(base_url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    body = json.dumps({"model": "tiny", "messages": HELLO, "stream": True, "max_tokens": 400,
                       "temperature": 1.0}).encode()
    connection.request("POST", "/v1/chat/completions", body=body,
                       headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200
    for _ in range(6):  # the role chunk, then generated text: the request is decoding
        response.readline()
    assert tiny_chat.engine.load["running"] == 1
    freed_after = _hang_up(connection, tiny_chat, wait=10)
    # A decoding step of the tiny model takes milliseconds; 3 s leaves room for a loaded CI machine.
    assert freed_after < 3.0, f"the row was held {freed_after:.2f} s after the client left"


def _hang_up(connection: http.client.HTTPConnection, tiny_chat, wait: float) -> float:
    """Close the client's side mid-answer; the seconds until the engine freed every row (at most `wait`)."""
    connection.sock.close()
    connection.close()
    hung_up = time.perf_counter()
    while tiny_chat.engine.load["running"] and time.perf_counter() - hung_up < wait:
        time.sleep(0.005)
    freed_after = time.perf_counter() - hung_up
    assert tiny_chat.engine.load == {"running": 0, "waiting": 0}
    return freed_after


def test_a_client_that_hangs_up_before_a_whole_answer_frees_its_row_while_tokens_flow(base_url, tiny_chat):
    """Without stream: the server's only chance to notice is to ask, and tokens arrive every step."""
    ask = {"model": "tiny", "messages": HELLO, "max_tokens": 900, "temperature": 1.0, "seed": 1}
    started = time.perf_counter()
    status, whole = _chat(base_url, **{k: v for k, v in ask.items() if k != "model"})
    full = time.perf_counter() - started
    assert status == 200 and whole["usage"]["completion_tokens"] == 900  # no end token: it runs to max_tokens
    url = urlparse(base_url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    connection.request("POST", "/v1/chat/completions", body=json.dumps(ask).encode(),
                       headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    deadline = time.perf_counter() + 10
    while not tiny_chat.engine.load["running"] and time.perf_counter() < deadline:
        time.sleep(0.005)
    assert tiny_chat.engine.load["running"] == 1
    freed_after = _hang_up(connection, tiny_chat, wait=30)
    assert freed_after < full / 3, f"the row was held {freed_after:.2f} s of the {full:.2f} s a whole answer takes"
