"""Tool calling and structured outputs through `gym api` and the real openai client.

Two servers around the tiny model with the chatml template (Qwen's/Hermes' tool format): one whose engine is
scripted, to test reading calls out of what a model writes (an untrained model writes no calls by itself), and one
with the real engine, where tool_choice and response_format force the answer's shape with a grammar.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest
from tests.infer.test_chat_tools import ADD, TOOLS, WEATHER  # the same two tools as the chat's tests

from gym.infer.requests import Finished, Piece, admit

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL_TEXT = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n'
             "</tool_call>")
ANSWER = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]},
                                           "confidence": {"type": "integer", "minimum": 0, "maximum": 100}},
          "required": ["answer", "confidence"], "additionalProperties": False}


def raw(base_url: str, path: str, body: dict) -> tuple[int, dict]:
    """(status, JSON) of a POST, for what the openai client does not send (/tokenize) or hides (an error's param)."""
    request = urllib.request.Request(base_url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


class ScriptedEngine:
    """Answers every request with `text`, three characters a piece (as a model's tokens would come). It cannot
    constrain decoding (it gives `admit` no matcher), as vLLM's engine cannot."""

    text = ""
    load: dict[str, int] = {}

    def __init__(self) -> None:
        self.prompts: list[list[int]] = []

    def submit(self, prompt_ids, params, sink=None):
        self.prompts.append(list(prompt_ids))
        request = admit(prompt_ids, params, sink, running=True, queued=0, limit=1, queued_as="waiting")
        for i in range(0, len(self.text), 3):
            request.emit(Piece(self.text[i:i + 3], []))
        request.emit(Finished("stop", len(prompt_ids), 7, self.text))
        return request

    def shutdown(self, timeout: float = 30.0) -> None:
        pass


def chatml_model(tiny_model_dir):
    from gym.infer.chat import ChatModel

    return ChatModel({"model_name_or_path": str(tiny_model_dir), "template": "chatml", "max_new_tokens": 48},
                     max_batch_size=8)


@pytest.fixture(scope="module")
def scripted(tiny_model_dir, serve_app):
    model = chatml_model(tiny_model_dir)
    engine = model._engine = ScriptedEngine()
    client = openai.OpenAI(base_url=f"{serve_app(model, 'tiny')}/v1", api_key="none", max_retries=0, timeout=60)
    yield client, engine, model
    model.close()


@pytest.fixture(scope="module")
def base(embedded_dir, serve_app):
    """The embedded model, untrained for tools: what forcing must hold for is a model that would not call by itself."""
    from gym.infer.chat import ChatModel

    model = ChatModel({"model_name_or_path": str(embedded_dir), "template": "chatml"}, max_batch_size=10)
    yield openai.OpenAI(base_url=f"{serve_app(model, 'tiny')}/v1", api_key="none", max_retries=0, timeout=120)
    model.close()


@pytest.fixture(scope="module")
def real(tiny_model_dir, serve_app):
    model = chatml_model(tiny_model_dir)
    base_url = serve_app(model, "tiny")
    yield openai.OpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0, timeout=60), base_url, model
    model.close()


def test_a_written_call_comes_back_as_tool_calls(scripted):
    client, engine, _ = scripted
    engine.text = CALL_TEXT
    response = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me check."
    [call] = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 2}
    assert response.usage.completion_tokens == 7


def test_a_streamed_call_is_assembled_by_the_openai_client(scripted):
    client, engine, _ = scripted
    engine.text = CALL_TEXT
    chunks = list(client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert content == "Let me check."  # what the whole answer's content is; the call never shows as text
    with client.chat.completions.stream(model="tiny", messages=ASK, tools=TOOLS) as stream:
        final = stream.get_final_completion()
    [call] = final.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris", "days": 2}
    assert call.id.startswith("call_") and final.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("text", ['<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>',
                                  "Sure <tool_call> is how I would call, but I will not."])
def test_text_that_is_not_a_valid_call_stays_content(scripted, text):
    client, engine, _ = scripted
    engine.text = text
    whole = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS)
    assert whole.choices[0].message.content == text and not whole.choices[0].message.tool_calls
    assert whole.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text


def test_tool_choice_none_leaves_a_call_as_content(scripted):
    client, engine, _ = scripted
    engine.text = CALL_TEXT
    response = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="none")
    assert response.choices[0].message.content == CALL_TEXT and response.choices[0].finish_reason == "stop"


def test_an_engine_without_constrained_decoding_says_so_naming_the_field(scripted):
    client, engine, _ = scripted
    engine.text = "{}"
    for extra, param in [({"response_format": {"type": "json_object"}}, "response_format"),
                         ({"tools": TOOLS, "tool_choice": "required"}, "tool_choice")]:
        with pytest.raises(openai.BadRequestError, match="cannot constrain decoding") as error:
            client.chat.completions.create(model="tiny", messages=ASK, **extra)
        assert error.value.body["param"] == param
    assert client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS).choices[0].message.content == "{}"


def test_the_tools_and_a_history_of_calls_are_rendered_in_the_prompt(real):
    client, base_url, model = real
    status, plain = raw(base_url, "/tokenize", {"messages": ASK})
    status, offered = raw(base_url, "/tokenize", {"messages": ASK, "tools": TOOLS})
    assert status == 200 and offered["count"] > plain["count"]
    text = model.tokenizer.decode(offered["tokens"])
    assert "<tools>" in text and '"name": "get_weather"' in text
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_9", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": '{"city": "Paris", "days": 2}'}}]},
        {"role": "tool", "tool_call_id": "call_9", "content": "Sunny, 21 C"}]
    status, rendered = raw(base_url, "/tokenize", {"messages": history, "tools": TOOLS})
    text = model.tokenizer.decode(rendered["tokens"])
    assert status == 200 and '"arguments": {"city": "Paris", "days": 2}' in text and "Sunny, 21 C" in text
    assert text.rstrip().endswith("assistant")  # ready for the answer after the result
    response = client.chat.completions.create(model="tiny", messages=history, tools=TOOLS, max_tokens=4)
    assert response.usage.prompt_tokens == rendered["count"]


def ten_at_once(ask):
    """Ten requests in flight together, as the engine batches them; their answers in seed order."""
    with ThreadPoolExecutor(10) as pool:
        return list(pool.map(ask, range(10)))


def test_required_calls_validate_against_the_function_schema_ten_of_ten(base):
    def ask(seed):
        return base.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required",
                                                  parallel_tool_calls=False, temperature=1.0, seed=seed,
                                                  max_tokens=64)

    for response in ten_at_once(ask):
        choice = response.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
        [call] = choice.message.tool_calls
        schema = {"get_weather": WEATHER, "add": ADD}[call.function.name]["function"]["parameters"]
        jsonschema.validate(json.loads(call.function.arguments), schema)


def test_a_named_function_is_called_and_streams(real):
    client = real[0]
    named = {"type": "function", "function": {"name": "add"}}
    with client.chat.completions.stream(model="tiny", messages=ASK, tools=TOOLS, tool_choice=named, temperature=1.0,
                                        seed=3, max_tokens=64) as stream:
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls
    assert calls and {c.function.name for c in calls} == {"add"}
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), ADD["function"]["parameters"])


def test_response_format_json_schema_ten_of_ten(base):
    client = base
    response_format = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": ANSWER, "strict": True}}

    def ask(seed):
        return client.chat.completions.create(model="tiny", messages=ASK, response_format=response_format,
                                              temperature=1.0, seed=seed, max_tokens=32)

    for response in ten_at_once(ask):
        assert response.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(response.choices[0].message.content), ANSWER)
    anything = client.chat.completions.create(model="tiny", messages=ASK, response_format={"type": "json_object"},
                                              temperature=0, max_tokens=32)
    assert anything.choices[0].message.content.startswith("{")


@pytest.mark.parametrize("extra, param", [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}],
      "tool_choice": "required"}, "tools"),
    # a forced call to such a name came back as content: the grammar writes the name raw into the call's JSON
    ({"tools": [{"type": "function", "function": {"name": 'say"hi'}}], "tool_choice": "required"}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "x{arguments}"}}], "tool_choice": "required"}, "tools"),
    ({"tools": TOOLS + TOOLS[:1], "tool_choice": "required"}, "tools"),  # which of the two would a call be
    ({"response_format": {"type": "yaml"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format"),
    ({"messages": ASK + [{"role": "assistant", "tool_calls": [{"type": "function", "function": {
        "name": "add", "arguments": "{not json"}}]}, {"role": "tool", "content": "1"}]}, "messages"),
    # a result with nothing to answer, or for a call no assistant made, was taken for the last call's result
    ({"messages": [{"role": "tool", "tool_call_id": "c1", "content": "4"}]}, "messages.0"),
    ({"messages": ASK + [{"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "add", "arguments": "{}"}}]}, {"role": "tool", "tool_call_id": "zzz", "content": "1"}]},
     f"messages.{len(ASK) + 1}.tool_call_id"),
])
def test_unusable_tool_and_format_fields_are_400_naming_the_param(real, extra, param):
    base_url = real[1]
    status, body = raw(base_url, "/v1/chat/completions", {"model": "tiny", "messages": ASK, **extra})
    assert status == 400, body
    assert body["error"]["param"] == param and body["error"]["message"]


ENDLESS = {"$defs": {"n": {"type": "object", "properties": {"n": {"$ref": "#/$defs/n"}}, "required": ["n"]}},
           "$ref": "#/$defs/n"}  # valid JSON Schema, but no finite JSON matches it


@pytest.mark.parametrize("extra, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": ENDLESS}}}, "response_format"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": ENDLESS}}], "tool_choice": "required"},
     "tools"),
])
def test_a_schema_the_grammar_gives_up_on_is_a_400_not_json_cut_short(real, extra, param):
    """llguidance stops part way (its item limit) on such a schema: the answer was `{"` or `<` with
    finish_reason "stop", as if it were valid. Streamed, the 400 comes as the stream's error event."""
    client, base_url, _ = real
    status, body = raw(base_url, "/v1/chat/completions", {"model": "tiny", "messages": ASK, **extra})
    assert status == 400 and body["error"]["param"] == param, body
    assert "could not go on" in body["error"]["message"]
    with pytest.raises(openai.APIError, match="could not go on"):
        list(client.chat.completions.create(model="tiny", messages=ASK, stream=True, **extra))


def test_gym_chat_shows_calls_and_sends_the_next_line_as_their_result(scripted, capsys, monkeypatch):
    from gym.cli.chat import _interactive

    _, engine, model = scripted
    engine.text = CALL_TEXT
    lines = iter(["Weather in Paris?", "Sunny, 21 C", "/exit"])
    monkeypatch.setattr("builtins.input", lambda prompt: (print(prompt, end=""), next(lines))[1])
    assert _interactive(model, TOOLS) == 0
    out = capsys.readouterr().out
    assert 'Let me check.\n-> get_weather({"city": "Paris", "days": 2})' in out and "Tool result: " in out
    last_prompt = model.tokenizer.decode(engine.prompts[-1])
    assert last_prompt.index('"name": "get_weather"') < last_prompt.index("Sunny, 21 C")  # the call, then its result
