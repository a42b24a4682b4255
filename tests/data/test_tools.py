"""Reading tools and tool calls from every shape users bring: LLaMA-Factory sharegpt rows, OpenAI/TRL messages rows,
OpenAI requests; malformed ones fail naming the file, row and field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gym.config.data import TOOL_FORMAT_NAMES, DataArguments
from gym.core.errors import ConfigError, DataError
from gym.data.loader import get_dataset, load_examples
from gym.data.messages import messages_from_openai, messages_to_openai
from gym.data.processors import encode_pairwise, encode_prompt
from gym.data.registry import get_dataset_attrs
from gym.data.templates import get_chat_format
from gym.data.tools import TOOL_FORMAT_ALIASES, TOOL_FORMATS, ToolCall

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "toolcall_glaive_shape.json"
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}


def _glaive_dir(tmp_path: Path) -> Path:
    shutil.copy(FIXTURE, tmp_path / "glaive.json")
    (tmp_path / "dataset_info.json").write_text(json.dumps({"glaive": {
        "file_name": "glaive.json", "formatting": "sharegpt",
        "columns": {"messages": "conversations", "tools": "tools"}}}))
    return tmp_path


def _load(folder: Path, name: str, kind: str = "supervised"):
    (attr,) = get_dataset_attrs(name, folder)
    return load_examples(attr, kind)


def _write_rows(folder: Path, rows: list, formatting: str = "sharegpt") -> Path:
    (folder / "rows.json").write_text(json.dumps(rows))
    columns = {"messages": "conversations", "tools": "tools"} if formatting == "sharegpt" else {"tools": "tools"}
    (folder / "dataset_info.json").write_text(json.dumps(
        {"rows": {"file_name": "rows.json", "formatting": formatting, "columns": columns}}))
    return folder


def test_glaive_rows_read_calls_results_and_tools(tmp_path):
    single, plain, parallel = _load(_glaive_dir(tmp_path), "glaive")
    assert single.tools and single.tools[0]["function"]["name"] == "search_recipes"
    assert single.tools[0]["type"] == "function"  # bare LF functions become OpenAI-shaped
    call_turn = single.messages[1]
    assert call_turn["role"] == "assistant" and call_turn["content"] == ""
    assert call_turn["tool_calls"] == [ToolCall("search_recipes", '{"ingredients": ["chicken", "rice"]}')]
    assert single.messages[2] == {"role": "observation", "content": '{"recipes": [{"name": "Chicken fried rice"}]}'}
    assert plain.tools is None  # "[]": offers nothing
    assert [c.name for c in parallel.messages[1]["tool_calls"]] == ["convert_currency", "convert_currency"]


def test_glaive_rows_render_tools_into_the_prompt(tmp_path, tokenizer):
    folder = _glaive_dir(tmp_path)
    chat = get_chat_format(tokenizer, "qwen")
    data = get_dataset(DataArguments(dataset="glaive", dataset_dir=str(folder), template="qwen"), chat, "supervised")
    first = data.train[0]
    prompt_ids = [t for t, label in zip(first["input_ids"], first["labels"]) if label == -100]
    learned = [t for t, label in zip(first["input_ids"], first["labels"]) if label != -100]
    assert "<tools>" in tokenizer.decode(prompt_ids) and "search_recipes" in tokenizer.decode(prompt_ids)
    assert '<tool_call>\n{"name": "search_recipes"' in tokenizer.decode(learned)
    assert "Chicken fried rice" not in tokenizer.decode(learned)  # the tool result is prompt


def test_openai_messages_rows_with_parallel_calls_and_results(tmp_path):
    row = {"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "20C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "25C"},
        {"role": "assistant", "content": "Paris 20C, Rome 25C."}], "tools": [WEATHER]}
    (ex,) = _load(_write_rows(tmp_path, [row], "openai"), "rows")
    assert ex.system == "Be brief." and ex.tools == [WEATHER]
    assert [c.id for c in ex.messages[1]["tool_calls"]] == ["call_1", "call_2"]
    assert ex.messages[1]["tool_calls"][1].arguments == '{"city": "Rome"}'
    observation = ex.messages[2]
    assert observation["role"] == "observation" and observation["results"] == ["20C", "25C"]
    assert observation["tool_call_ids"] == ["call_1", "call_2"]
    # and back: the OpenAI messages a client would send again
    again = messages_to_openai(ex.messages, ex.system)
    assert [m["role"] for m in again] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert messages_from_openai(again) == (ex.system, ex.messages)


def test_bare_file_with_messages_and_tools_is_sniffed(tmp_path):
    row = {"messages": [{"role": "user", "content": "Hi"},
                        {"role": "assistant", "tool_calls": [{"function": {"name": "get_weather",
                                                                           "arguments": {"city": "Oslo"}}}]},
                        {"role": "tool", "content": "1C"}, {"role": "assistant", "content": "Cold."}],
           "tools": json.dumps([WEATHER])}
    (tmp_path / "chat.jsonl").write_text(json.dumps(row) + "\n")
    (attr,) = get_dataset_attrs(str(tmp_path / "chat.jsonl"), tmp_path)
    (ex,) = load_examples(attr, "supervised")
    assert ex.tools == [WEATHER] and ex.messages[1]["tool_calls"][0].name == "get_weather"


@pytest.mark.parametrize(("value", "problem"), [
    ("get_weather(city='Paris')", "not valid JSON"),
    ('{"arguments": {"city": "Paris"}}', "no function name"),
    ('{"name": "get_weather", "arguments": ["Paris"]}', "must be a JSON object"),
    ('[{"name": "get_weather", "arguments": {}}, {"name": ""}]', r"\[1\]: a call has no function name"),
    # written raw into `{"name": "..."}`, a quote would train a call no parser reads back
    ('{"name": "get\\"weather", "arguments": {}}', "function name 'get\"weather' holds '\"'"),
])
def test_malformed_function_call_names_file_row_and_field(tmp_path, value, problem):
    rows = [{"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]},
            {"conversations": [{"from": "human", "value": "Weather?"}, {"from": "function_call", "value": value},
                               {"from": "observation", "value": "20C"}, {"from": "gpt", "value": "Warm."}]}]
    folder = _write_rows(tmp_path, rows)
    with pytest.raises(DataError, match=rf"rows.json, row 2: field 'conversations\[1\].value' .*{problem}"):
        _load(folder, "rows")


def test_malformed_openai_tool_calls_and_tools_name_the_field(tmp_path):
    bad_call = {"messages": [{"role": "user", "content": "Hi"},
                             {"role": "assistant", "tool_calls": [{"type": "function", "function": {
                                 "name": "get_weather", "arguments": "{city: Paris}"}}]},
                             {"role": "tool", "content": "x"}, {"role": "assistant", "content": "y"}]}
    with pytest.raises(DataError, match=r"row 1: field 'messages\[1\].tool_calls\[0\]' .*not valid JSON"):
        _load(_write_rows(tmp_path, [bad_call], "openai"), "rows")
    bad_tools = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "y"}],
                 "tools": '[{"description": "no name"}]'}
    with pytest.raises(DataError, match=r"row 1: field 'tools' is not a valid tool list: \[0\] has no function name"):
        _load(_write_rows(tmp_path, [bad_tools], "openai"), "rows")


def test_requests_convert_with_errors_naming_the_message():
    system, messages = messages_from_openai([
        {"role": "developer", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi"}]}])
    assert system == "Be brief." and messages == [{"role": "user", "content": "Hi"}]
    with pytest.raises(DataError, match=r"messages\[1\].tool_calls\[0\] is not a valid call: a call has no function"):
        messages_from_openai([{"role": "user", "content": "Hi"},
                              {"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}])
    with pytest.raises(DataError, match=r"messages\[1\].role .*turns must alternate"):
        messages_from_openai([{"role": "user", "content": "Hi"}, {"role": "tool", "content": "x"}])


def test_a_request_may_send_several_user_messages_in_a_row():
    """A client's "context" then "question" is one user turn (texts joined by a blank line), as it was before tools;
    training data keeps alternating strictly."""
    system, messages = messages_from_openai([
        {"role": "system", "content": "S"}, {"role": "user", "content": "Here is a text."},
        {"role": "user", "content": [{"type": "text", "text": "Summarise it."}]}])
    assert system == "S" and messages == [{"role": "user", "content": "Here is a text.\n\nSummarise it."}]


def test_tokenizer_template_that_ignores_tools_fails_naming_the_fix(tmp_path, tokenizer):
    """The embedded SmolLM2 template renders neither `tools` nor `tool_calls`: training on it would drop both."""
    folder = _glaive_dir(tmp_path)
    chat = get_chat_format(tokenizer)
    support = chat.tool_support()
    assert not support.renders_tools and not support.renders_calls and chat.tool_format is None
    with pytest.raises(DataError, match=r"glaive.json, row 1 has tools .* ignores the `tools` list .*`template:`"
                                        r".*`tool_format:`"):
        get_dataset(DataArguments(dataset="glaive", dataset_dir=str(folder)), chat, "supervised")
    # `tool_format:` writes tools and calls as text inside the template's own messages
    chat = get_chat_format(tokenizer, tool_format="hermes")
    assert chat.tool_format is TOOL_FORMATS["qwen"]
    data = get_dataset(DataArguments(dataset="glaive", dataset_dir=str(folder), tool_format="hermes"), chat,
                       "supervised")
    text = tokenizer.decode(data.train[0]["input_ids"])
    assert "<tools>" in text and '<tool_call>\n{"name": "search_recipes"' in text


def test_named_template_without_a_tool_format_fails(tmp_path, tokenizer):
    folder = _glaive_dir(tmp_path)
    with pytest.raises(DataError, match="template 'gemma' has no tool format.*`tool_format:`"):
        get_dataset(DataArguments(dataset="glaive", dataset_dir=str(folder)), get_chat_format(tokenizer, "gemma"),
                    "supervised")
    chat = get_chat_format(tokenizer, "gemma", tool_format="default")
    assert "Action: search_recipes" in "".join(p + r for p, r in chat.render_pairs(
        _load(folder, "glaive")[0].messages, None, _load(folder, "glaive")[0].tools))


def test_parallel_calls_in_a_format_without_them_fail_naming_the_row(tmp_path, tokenizer):
    folder = _glaive_dir(tmp_path)
    with pytest.raises(DataError, match="glaive.json, row 3: .*glm4 tool format has no parallel calls"):
        get_dataset(DataArguments(dataset="glaive", dataset_dir=str(folder)), get_chat_format(tokenizer, "glm4"),
                    "supervised")


def test_pairwise_and_prompt_rows_carry_tools_in_the_prompt(tmp_path, tokenizer):
    row = {"conversations": [{"from": "human", "value": "Weather in Oslo?"}],
           "chosen": {"from": "gpt", "value": "Let me look."}, "rejected": {"from": "gpt", "value": "No."},
           "tools": json.dumps([WEATHER])}
    (tmp_path / "p.json").write_text(json.dumps([row]))
    (tmp_path / "dataset_info.json").write_text(json.dumps({"p": {
        "file_name": "p.json", "formatting": "sharegpt", "ranking": True,
        "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected", "tools": "tools"}}}))
    chat = get_chat_format(tokenizer, "llama3")
    (pair,) = _load(tmp_path, "p", "pairwise")
    encoded = encode_pairwise(pair, chat, 4096)
    assert encoded is not None and "get_weather" in tokenizer.decode(encoded["prompt_ids"])
    (prompt,) = _load(tmp_path, "p", "prompt")
    row_out = encode_prompt(prompt, chat, 4096)
    assert row_out is not None and "You have access to the following functions" in row_out["prompt"]


def test_tool_format_key_is_checked_with_a_suggestion(tokenizer):
    assert sorted(TOOL_FORMAT_NAMES) == sorted([*TOOL_FORMATS, *TOOL_FORMAT_ALIASES])
    with pytest.raises(ConfigError, match="Unknown tool_format 'hermez'. Did you mean 'hermes'"):
        DataArguments(tool_format="hermez").validate(None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="Did you mean 'llama3'"):
        get_chat_format(tokenizer, "qwen", tool_format="lama3")


@pytest.mark.parametrize("name", ["toolcall_demo", "toolcall_eval_demo"])
def test_shipped_toolcall_demos_load_and_train_on_calls(tokenizer, name):
    data_dir = Path(__file__).resolve().parent.parent.parent / "data"
    examples = _load(data_dir, name)
    assert all(ex.tools for ex in examples)
    assert any(len(m.get("tool_calls") or ()) > 1 for ex in examples for m in ex.messages)  # parallel rows
    assert any(len(ex.messages) == 2 for ex in examples)  # rows that need no tool
    chat = get_chat_format(tokenizer, "qwen")
    data = get_dataset(DataArguments(dataset=name, dataset_dir=str(data_dir), template="qwen"), chat, "supervised")
    assert data.stats["dropped"] == 0 and len(data.train) == len(examples)
