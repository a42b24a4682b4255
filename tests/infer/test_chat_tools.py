"""Tools at inference: the forced-call grammar accepts exactly what each format writes, streamed answers hold back
what may be a call, and a ChatModel offers tools in the prompt, forces calls and parses them."""

from __future__ import annotations

import json

import jsonschema
import pytest

from gym.data.tools import TOOL_FORMATS, ToolCall, get_tool_format
from gym.infer import grammar
from gym.infer.tool_choice import (
    CallStream,
    RequestFieldError,
    ToolChoice,
    answer_or_calls,
    answer_schema,
    calls_grammar,
    parse_reply,
)

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string", "enum": ["Paris", "Oslo"]},
                                                "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                                                "required": ["city", "days"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {
    "a": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["a"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]
CALLS = [ToolCall("get_weather", '{"city": "Paris", "days": 3}', "call_1"), ToolCall("add", '{"a": 4}', "call_2")]
QWEN = get_tool_format("qwen")


def accepts(tokenizer, grammar_text: str, text: str) -> bool:
    matcher = grammar.Matcher(grammar.lark(grammar_text), tokenizer, [])
    for token in tokenizer.encode(text, add_special_tokens=False):
        matcher.advance(token)
        if matcher.error:
            return False
    return matcher.accepting


@pytest.mark.parametrize("name", sorted(TOOL_FORMATS))
def test_the_forced_call_grammar_accepts_what_each_format_writes(tokenizer, name):
    tool_format = TOOL_FORMATS[name]
    one, two = tool_format.calls_text(CALLS[:1]), tool_format.calls_text(CALLS) if tool_format.layout.parallel else None
    assert accepts(tokenizer, calls_grammar(tool_format.layout, TOOLS, parallel=False), one)
    assert accepts(tokenizer, calls_grammar(tool_format.layout, TOOLS, parallel=True), one)
    if two is not None:
        assert accepts(tokenizer, calls_grammar(tool_format.layout, TOOLS, parallel=True), two)
        assert not accepts(tokenizer, calls_grammar(tool_format.layout, TOOLS, parallel=False), two)
    named = calls_grammar(tool_format.layout, [ADD], parallel=False)
    assert not accepts(tokenizer, named, one)  # a named function: only calls to it
    bad = tool_format.calls_text([ToolCall("get_weather", '{"city": "Rome", "days": 3}')])
    assert not accepts(tokenizer, calls_grammar(tool_format.layout, TOOLS, parallel=True), bad)  # the schema holds
    if answer_or_calls(tool_format.layout):
        either = calls_grammar(tool_format.layout, TOOLS, parallel=True, answer={"type": "object"})
        assert accepts(tokenizer, either, '{"x": 1}') and accepts(tokenizer, either, one)


def test_a_streamed_answer_holds_back_what_may_be_a_call():
    text = 'Let me look.\n<tool_call>\n{"name": "add", "arguments": {"a": 4}}\n</tool_call>'
    stream = CallStream(QWEN)
    shown = "".join(stream.feed(text[i:i + 3]) for i in range(0, len(text), 3))
    assert "<" not in shown and shown.startswith("Let me look.")
    rest, calls = stream.finish()
    assert (shown + rest).strip() == "Let me look." and [(c.name, c.arguments) for c in calls] == [("add", '{"a": 4}')]
    assert calls[0].id and calls[0].id.startswith("call_")


@pytest.mark.parametrize("text", ["a <tool and more", "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": }\n"
                                  "</tool_call>", "<tool_call>not json</tool_call> trailing"])
def test_text_that_is_not_a_call_stays_content(text):
    stream = CallStream(QWEN)
    shown = "".join(stream.feed(ch) for ch in text)
    rest, calls = stream.finish()
    assert shown + rest == text and calls == []
    reply = parse_reply(QWEN, text, "length")
    assert (reply.content, reply.calls, reply.finish_reason) == (text, [], "length")


def test_tool_choice_and_response_format_name_what_is_wrong():
    assert ToolChoice.parse(None, []) == ToolChoice("auto")
    assert ToolChoice.parse({"type": "function", "function": {"name": "add"}}, TOOLS) == ToolChoice("function", "add")
    for value, tools, words in [("maybe", TOOLS, "must be one of"), ("required", [], "offers no tools"),
                                ({"type": "function", "function": {"name": "nope"}}, TOOLS, "not among the tools"),
                                ({"function": {}}, TOOLS, "a named choice")]:
        with pytest.raises(RequestFieldError, match=words) as error:
            ToolChoice.parse(value, tools)
        assert error.value.field == "tool_choice"
    assert answer_schema({"type": "text"}) is None and answer_schema({"type": "json_object"}) == {"type": "object"}
    with pytest.raises(RequestFieldError) as error:
        answer_schema({"type": "json_schema", "json_schema": {"name": "x"}})
    assert error.value.field == "response_format"


@pytest.fixture(scope="module")
def tool_chat(tiny_model_dir):
    from gym.infer.chat import ChatModel

    model = ChatModel({"model_name_or_path": str(tiny_model_dir), "template": "chatml", "max_new_tokens": 48},
                      max_batch_size=8)
    yield model
    model.close()


def test_tools_are_described_in_the_prompt(tool_chat):
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    prompt = tool_chat.tokenizer.decode(tool_chat.prepare(ask, tools=TOOLS).prompt)
    assert QWEN.tools_text(TOOLS).strip() in prompt and tool_chat.tokenizer.decode(tool_chat.render(ask)) not in ("",)
    assert len(tool_chat.prepare(ask, tools=TOOLS, tool_choice="none").prompt) > len(tool_chat.render(ask))


def test_forced_calls_follow_the_schema_and_stream_like_the_whole(tool_chat):
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    for seed in range(3):
        stream = tool_chat.stream_reply(ask, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                                        seed=seed, temperature=1.0, do_sample=True)
        shown = "".join(stream)
        reply = stream.reply
        assert reply is not None and reply.finish_reason == "tool_calls" and len(reply.calls) == 1, reply
        assert shown == reply.content == ""
        call = reply.calls[0]
        schema = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == call.name)
        jsonschema.validate(json.loads(call.arguments), schema)
    named = tool_chat.reply(ask, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}}, seed=1,
                            temperature=1.0, do_sample=True)
    assert [c.name for c in named.calls] == ["add"]


def test_a_forced_call_the_grammar_gives_up_on_is_an_error_not_a_reply(tool_chat):
    """A function whose parameters no finite JSON matches: the answer stops at `<`, which must not come back as a
    finished reply (finish_reason "stop", content "<")."""
    endless = {"$defs": {"n": {"type": "object", "properties": {"n": {"$ref": "#/$defs/n"}}, "required": ["n"]}},
               "$ref": "#/$defs/n"}
    tools = [{"type": "function", "function": {"name": "f", "parameters": endless}}]
    ask = [{"role": "user", "content": "Hi"}]
    with pytest.raises(grammar.GrammarStopped, match="Too many items"):
        tool_chat.reply(ask, tools=tools, tool_choice="required")
    with pytest.raises(grammar.GrammarStopped):
        list(tool_chat.stream_reply(ask, response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": endless}}))


def test_a_template_that_cannot_render_tools_says_how_to_fix_it(tiny_model_dir):
    from gym.infer.chat import ChatModel

    model = ChatModel({"model_name_or_path": str(tiny_model_dir)})  # SmolLM2's own template ignores tools
    with pytest.raises(RequestFieldError, match="tool_format") as error:
        model.prepare([{"role": "user", "content": "Hi"}], tools=TOOLS)
    assert error.value.field == "tools"
