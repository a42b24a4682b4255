"""`gym api` through the real openai client, on 127.0.0.1, with the tiny model."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

KEY = "test-key"
HELLO = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def base_url(serve_app, tiny_chat):
    return serve_app(tiny_chat, "tiny", api_key=KEY)


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=KEY, max_retries=0, timeout=60)


def raw(base_url: str, path: str, body: bytes | None = None, key: str | None = KEY, method: str | None = None):
    """(status, JSON) for requests the openai client cannot make (bad JSON, no key, odd routes)."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(base_url + path, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def rss_mb() -> float:
    """This process's resident memory (server and clients share it here, so this over-counts the server)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024


def test_models_and_health(client, base_url):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    status, health = raw(base_url, "/health", key=None)  # health needs no key (load balancers probe it)
    assert status == 200 and health["status"] == "ok"


def test_chat_answers_as_the_chat_model_does_with_exact_usage(client, tiny_chat):
    response = client.chat.completions.create(model="tiny", messages=HELLO, temperature=0, max_tokens=9)
    reference = tiny_chat.engine.generate(tiny_chat.render(HELLO), tiny_chat.sampling_params(do_sample=False,
                                                                                             max_new_tokens=9))
    assert response.choices[0].message.content == reference.text
    assert response.choices[0].finish_reason == reference.reason
    assert response.usage.prompt_tokens == len(tiny_chat.render(HELLO))
    assert response.usage.completion_tokens == reference.completion_tokens == 9
    assert response.usage.total_tokens == response.usage.prompt_tokens + 9


def test_streaming_gives_the_same_text_piece_by_piece_and_usage_last(client):
    whole = client.chat.completions.create(model="tiny", messages=HELLO, temperature=0, max_tokens=8)
    chunks = list(client.chat.completions.create(model="tiny", messages=HELLO, temperature=0, max_tokens=8,
                                                 stream=True, stream_options={"include_usage": True}))
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 1 and "".join(pieces) == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8


def test_n_choices_with_a_seed_are_distinct_and_reproducible(client):
    ask = dict(model="tiny", messages=HELLO, temperature=1.0, top_p=1.0, max_tokens=10, n=3, seed=5)
    first, again = client.chat.completions.create(**ask), client.chat.completions.create(**ask)
    texts = [c.message.content for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert texts == [c.message.content for c in again.choices]
    assert len(set(texts)) > 1
    assert first.usage.completion_tokens == 30  # every choice ran to max_tokens (no end token from a random model)


def test_stop_sequences(client):
    full = client.chat.completions.create(model="tiny", messages=HELLO, temperature=0, max_tokens=12)
    text = full.choices[0].message.content
    stop = text[3:6]
    cut = client.chat.completions.create(model="tiny", messages=HELLO, temperature=0, max_tokens=12, stop=[stop])
    assert cut.choices[0].message.content == text[: text.find(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_completions_plain_and_streamed(client, tiny_chat):
    response = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=6, temperature=0)
    ids = tiny_chat.tokenizer.encode("Once upon a time")
    assert response.usage.prompt_tokens == len(ids) and response.usage.completion_tokens == 6
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny", prompt="Once upon a time", max_tokens=6, temperature=0, stream=True))
    assert streamed == response.choices[0].text
    echoed = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=6, temperature=0, echo=True)
    assert echoed.choices[0].text == "Once upon a time" + response.choices[0].text
    two = client.completions.create(model="tiny", prompt=["Once", "Twice"], max_tokens=2, temperature=0)
    assert len(two.choices) == 2


def test_auth_is_required_when_a_key_is_set(base_url):
    wrong = openai.OpenAI(base_url=f"{base_url}/v1", api_key="not-the-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="Invalid or missing API key") as error:
        wrong.models.list()
    assert error.value.body["code"] == "invalid_api_key"
    status, body = raw(base_url, "/v1/chat/completions", json.dumps({"model": "tiny", "messages": HELLO}).encode(),
                       key=None)
    assert status == 401 and body["error"]["type"] == "authentication_error"


@pytest.mark.parametrize("body, status, param", [
    ({"model": "tiny", "messages": []}, 400, "messages"),
    ({"model": "tiny"}, 400, "messages"),
    ({"model": "tiny", "messages": HELLO, "temperature": 5}, 400, "temperature"),
    ({"model": "tiny", "messages": HELLO, "n": 0}, 400, "n"),
    ({"model": "tiny", "messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages.0.role"),
    ({"model": "nope", "messages": HELLO}, 404, "model"),
    ({"model": "tiny", "messages": HELLO, "max_tokens": 100000}, 400, "max_tokens"),
    ({"model": "tiny", "messages": [{"role": "assistant", "content": "hi"}]}, 400, "messages"),
    ({"model": "tiny", "messages": HELLO, "tools": [{"type": "function"}]}, 400, "tools"),
    ({"model": "tiny", "messages": HELLO, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ({"model": "tiny", "messages": HELLO, "logprobs": True}, 400, "logprobs"),
    ({"model": "tiny", "messages": HELLO, "response_format": {"type": "json_schema", "json_schema": {
        "name": "a", "schema": {"type": "object", "properties": {"a": {"type": "string"}}, "requried": ["a"]}}}},
     400, "response_format"),
])
def test_bad_chat_requests_get_openai_shaped_4xx(base_url, body, status, param):
    got, answer = raw(base_url, "/v1/chat/completions", json.dumps(body).encode())
    assert got == status, answer
    assert set(answer["error"]) == {"message", "type", "param", "code"} and answer["error"]["message"]
    assert answer["error"]["param"] == param


@pytest.mark.parametrize("route, extra, message", [
    ("/v1/chat/completions", {"max_token": 3}, "Unrecognized request argument supplied: max_token. Did you mean "
                                               "'max_tokens'?"),
    ("/v1/chat/completions", {"foo": 1}, "Unrecognized request argument supplied: foo."),
    ("/v1/chat/completions", {"logit_bias": {"19556": -100}}, "logit_bias is not supported by this server."),
    ("/v1/completions", {"max_token": 2}, "Unrecognized request argument supplied: max_token."),
])
def test_a_field_the_server_would_ignore_is_refused_by_name(base_url, route, extra, message):
    # OpenAI answers 400 for an argument it does not know; dropping it would answer a request not made.
    base = {"model": "tiny", "messages": HELLO} if "chat" in route else {"model": "tiny", "prompt": "Hi"}
    status, answer = raw(base_url, route, json.dumps({**base, **extra}).encode())
    assert status == 400 and message in answer["error"]["message"], answer
    assert answer["error"]["param"] == next(iter(extra))


def test_fields_that_do_not_change_the_answer_are_accepted(client):
    reply = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=2, user="alice",
                                           metadata={"run": "1"}, store=False)
    assert reply.choices[0].message.content is not None


def test_bad_json_unknown_routes_and_methods(base_url, client):
    assert raw(base_url, "/v1/chat/completions", b"{not json")[0] == 400
    status, body = raw(base_url, "/v1/nothing-here")
    assert status == 404 and "Unknown route" in body["error"]["message"]
    assert raw(base_url, "/v1/chat/completions", method="GET")[0] == 405
    assert raw(base_url, "/v1/completions", json.dumps({"model": "tiny", "prompt": [10**9]}).encode())[0] == 400
    with pytest.raises(openai.BadRequestError, match=r"suffix \(insertion\) is not supported"):
        client.completions.create(model="tiny", prompt="x", suffix="y")


def test_tokenize_returns_the_ids_chat_requests_are_generated_from(base_url, tiny_chat):
    status, body = raw(base_url, "/tokenize", json.dumps({"model": "tiny", "messages": HELLO}).encode())
    assert status == 200 and body["tokens"] == tiny_chat.render(HELLO) and body["max_model_len"] == 1024


@pytest.mark.parametrize("body", [{"messages": []}, {"model": "tiny", "messages": []}])
def test_tokenize_refuses_an_empty_messages_list_as_chat_does(base_url, body):
    status, answer = raw(base_url, "/tokenize", json.dumps(body).encode())
    assert status == 400 and answer["error"]["param"] == "messages", answer
    assert "at least 1 item" in answer["error"]["message"]


def test_a_completion_prompt_longer_than_the_context_is_named_as_prompt(base_url):
    status, answer = raw(base_url, "/v1/completions", json.dumps({"model": "tiny", "prompt": list(range(100, 1200))})
                         .encode())
    assert status == 400 and answer["error"]["code"] == "context_length_exceeded"
    assert answer["error"]["param"] == "prompt"  # a completion has no `messages` for a client to shorten


def test_a_request_for_more_completions_than_the_queue_admits_is_a_400_not_a_429(base_url, tiny_chat):
    # tiny_chat waits 64 at most: 65 prompts could never all be admitted, so "retry later" would never come true
    body = {"model": "tiny", "prompt": ["Hi"] * 65, "max_tokens": 1}
    status, answer = raw(base_url, "/v1/completions", json.dumps(body).encode())
    assert status == 400 and answer["error"]["param"] == "prompt", answer
    assert "at most 64 at once" in answer["error"]["message"]
    assert tiny_chat.engine.load == {"running": 0, "waiting": 0}  # nothing was submitted
    status, answer = raw(base_url, "/v1/completions", json.dumps({**body, "prompt": ["Hi"] * 4, "n": 16}).encode())
    assert status == 200 and len(answer["choices"]) == 64  # exactly what the queue holds


@pytest.mark.parametrize("options, message", [
    ({"include_usag": True}, "Unrecognized request argument supplied: stream_options.include_usag. Did you mean "
                             "'include_usage'?"),
    ({"continuous_usage_stats": True}, "stream_options.continuous_usage_stats is not supported by this server."),
])
def test_a_stream_option_the_server_would_ignore_is_refused_by_name(base_url, options, message):
    body = {"model": "tiny", "messages": HELLO, "max_tokens": 2, "stream": True, "stream_options": options}
    status, answer = raw(base_url, "/v1/chat/completions", json.dumps(body).encode())
    assert status == 400 and answer["error"]["message"] == message
    assert answer["error"]["param"] == f"stream_options.{next(iter(options))}"


def test_include_usage_false_as_a_string_streams_no_usage(base_url):
    body = {"model": "tiny", "messages": HELLO, "max_tokens": 2, "stream": True,
            "stream_options": {"include_usage": "false"}}
    request = urllib.request.Request(base_url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=60) as response:
        events = [line[6:] for line in response.read().decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert all("usage" not in json.loads(event) for event in events[:-1])


@pytest.mark.parametrize("content_type, said", [
    ("text/plain", "It was sent as 'text/plain', not read as JSON: set the header Content-Type: application/json."),
    ("application/x-www-form-urlencoded", "Content-Type: application/json"),  # what `curl -d` sends
    ("application/json", ""),
])
def test_a_body_that_is_not_a_json_object_says_what_it_must_be(base_url, content_type, said):
    whole = json.dumps({"model": "tiny", "messages": HELLO}).encode()  # valid JSON, unread under another type
    data = b"[1, 2]" if content_type == "application/json" else whole
    request = urllib.request.Request(base_url + "/v1/chat/completions", data=data,
                                     headers={"Content-Type": content_type, "Authorization": f"Bearer {KEY}"})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=60)
    answer = json.loads(caught.value.read())
    assert caught.value.code == 400
    assert answer["error"]["message"].startswith("The request body must be a JSON object.")
    assert said in answer["error"]["message"]


def test_sixty_four_concurrent_chats_all_succeed_in_bounded_memory(client, tiny_chat):
    """The load test: 64 clients at once on 8 batch rows; none fails, the queue absorbs the rest."""
    def ask(i: int) -> tuple[str, int]:
        response = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": f"Count {i}."}],
                                                  max_tokens=8, temperature=0.8, seed=i)
        return response.choices[0].finish_reason, response.usage.completion_tokens

    before = rss_mb()
    peak, done = [before], threading.Event()

    def watch() -> None:
        while not done.wait(0.05):
            peak.append(rss_mb())

    watcher = threading.Thread(target=watch)
    watcher.start()
    with ThreadPoolExecutor(64) as pool:
        results = list(pool.map(ask, range(64)))
    done.set()
    watcher.join()
    grown_mb = max(peak) - before
    assert all(reason in ("stop", "length") and tokens >= 1 for reason, tokens in results)
    assert grown_mb < 256, f"peak memory grew by {grown_mb:.0f} MB serving 64 short requests"
    assert tiny_chat.engine.load == {"running": 0, "waiting": 0}


def test_a_full_queue_answers_429(serve_app, tiny_model_dir):
    from gym.infer.chat import ChatModel

    small = ChatModel({"model_name_or_path": str(tiny_model_dir)}, max_batch_size=1, max_waiting=1)
    client = openai.OpenAI(base_url=f"{serve_app(small, 'tiny')}/v1", api_key="none", max_retries=0)
    statuses: list[int] = []

    def ask() -> None:
        try:
            client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=150, temperature=0)
            statuses.append(200)
        except openai.RateLimitError as error:
            assert error.body["code"] == "rate_limit_exceeded"
            statuses.append(429)

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert 429 in statuses and 200 in statuses and len(statuses) == 4
