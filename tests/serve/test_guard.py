"""`gym api --guard`: the input refused with code content_filter, answers cut at the first flagged window with
finish_reason content_filter (streaming and not), and /v1/moderations in OpenAI's shape, through the openai client.

A keyword guard makes the flagged text exact: the tiny model's answer (sampled with a fixed seed: its greedy answer
is only newlines) is decoded once unguarded, and a word from its middle becomes the pattern, so the guarded answer
must stop before that word, at a window boundary."""

from __future__ import annotations

import re

import openai
import pytest

from gym.safety.guard import KeywordGuard
from gym.serve.guarding import GuardPolicy

ASK = [{"role": "user", "content": "Tell me a story about the sea."}]
MAX_TOKENS = 40
WINDOW = 4
SAMPLED = {"temperature": 1.0, "seed": 11}


@pytest.fixture(scope="module")
def reference(tiny_chat):
    """The unguarded greedy answer, and the token pieces it streams in."""
    params = tiny_chat.sampling_params(do_sample=True, max_new_tokens=MAX_TOKENS, **SAMPLED)
    finished = tiny_chat.engine.generate(tiny_chat.render(ASK), params)
    return finished.text


@pytest.fixture(scope="module")
def banned(reference):
    """A word from the middle of the reference answer (past the first window, so something is sent first)."""
    words = [w for w in re.findall(r"[A-Za-z]{4,}", reference)]
    middle = [w for w in words if reference.find(w) > len(reference) // 3 and reference[:reference.find(w)].strip()]
    assert middle, f"the tiny model's answer has no usable word: {reference!r}"
    return middle[0]


@pytest.fixture(scope="module")
def guard_file(tmp_path_factory, banned):
    path = tmp_path_factory.mktemp("guard") / "words.txt"
    path.write_text(f"# blocked words\n# category: violence\n\\bdetonate\\b\nbomb\n# category: illicit\n"
                    f"{re.escape(banned)}\n")
    return path


@pytest.fixture(scope="module")
def client(serve_app, tiny_chat, guard_file):
    policy = GuardPolicy(KeywordGuard(guard_file), window=WINDOW)
    url = serve_app(tiny_chat, "tiny", guard=policy)
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)


def test_a_flagged_request_is_refused_with_code_content_filter(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "How to build a BOMB?"}])
    error = caught.value.body
    assert error["code"] == "content_filter" and error["param"] == "messages"
    assert "violence" in error["message"]
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="tiny", prompt=["fine", "detonate it"], max_tokens=2)
    assert caught.value.body["code"] == "content_filter" and caught.value.body["param"] == "prompt.1"


def test_an_answer_stops_before_its_first_flagged_window(client, reference, banned):
    response = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=MAX_TOKENS, **SAMPLED)
    choice = response.choices[0]
    assert choice.finish_reason == "content_filter"
    sent = choice.message.content
    assert banned not in sent and reference.startswith(sent)
    assert sent.strip(), "the clean windows before the flagged one are sent"
    assert response.usage.completion_tokens >= WINDOW


def test_a_stream_stops_with_content_filter(client, reference, banned):
    stream = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=MAX_TOKENS, stream=True,
                                            **SAMPLED)
    text, reasons = "", []
    for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            if choice.finish_reason:
                reasons.append(choice.finish_reason)
    assert reasons == ["content_filter"]
    assert banned not in text and reference.startswith(text) and text.strip()
    non_streamed = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=MAX_TOKENS,
                                                  **SAMPLED).choices[0].message.content
    assert text == non_streamed


def test_a_clean_answer_is_unchanged(client, tiny_chat):
    ask = [{"role": "user", "content": "Hi"}]
    expected = tiny_chat.engine.generate(tiny_chat.render(ask), tiny_chat.sampling_params(do_sample=False,
                                                                                          max_new_tokens=6))
    response = client.chat.completions.create(model="tiny", messages=ask, temperature=0, max_tokens=6)
    assert response.choices[0].message.content == expected.text
    assert response.choices[0].finish_reason == expected.reason


def test_moderations_in_openais_shape(client, banned):
    result = client.moderations.create(input=["a calm day at the lake", "they plan to DETONATE it",
                                              f"some {banned} here"])
    assert result.id.startswith("modr-")
    calm, violent, illicit = result.results
    assert not calm.flagged and violent.flagged and illicit.flagged
    assert violent.categories.violence and not violent.categories.illicit
    assert violent.category_scores.violence == 1.0 and calm.category_scores.violence == 0.0
    assert illicit.categories.illicit and not illicit.categories.violence
    single = client.moderations.create(input="bomb")
    assert len(single.results) == 1 and single.results[0].flagged


def test_moderations_without_a_guard_is_a_404(serve_app, tiny_chat):
    url = serve_app(tiny_chat, "tiny")
    bare = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)
    with pytest.raises(openai.NotFoundError) as caught:
        bare.moderations.create(input="hello")
    assert "--guard" in caught.value.body["message"]


def test_a_guard_reads_the_clients_text_not_the_image_placeholder():
    # The model's `<image>` stood in the judged text: a list matching "image" flagged every request with an image.
    from gym.serve.guarding import guard_conversation
    from gym.serve.protocol import ChatCompletionRequest

    request = ChatCompletionRequest.model_validate({"model": "m", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                                     {"type": "text", "text": "Who is "}, {"type": "text", "text": "this?"}]},
        {"role": "assistant", "content": "A <image> tag, typed."}]})
    assert guard_conversation(request.messages) == [{"role": "user", "content": "Who is this?"},
                                                    {"role": "assistant", "content": "A <image> tag, typed."}]
