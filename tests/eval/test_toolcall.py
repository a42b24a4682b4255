"""Tool-call tasks: the scorer's normalisation, scripted answers through the whole task, and the real model once."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gym.core.errors import ConfigError, DataError
from gym.data.tools import ToolCall, canonical_json, get_tool_format
from gym.eval.config import parse_task
from gym.eval.toolcall import ToolCallSettings, read_conversations, score_calls, toolcall_task
from gym.infer.requests import Finished, Request

REPO = Path(__file__).resolve().parents[2]
DEMO = str(REPO / "data" / "toolcall_eval_demo.json")


def call(name: str, arguments: str) -> ToolCall:
    return ToolCall(name, arguments)


# -- scoring -----------------------------------------------------------------------------------------------------

def test_key_order_and_whitespace_do_not_matter():
    expected = [call("convert", '{"amount": 30, "from": "USD", "to": "JPY"}')]
    predicted = [call("convert", '{ "to":"JPY",\n  "from":"USD", "amount":30 }')]
    assert score_calls(expected, predicted) == {"call_rate": 1.0, "name_acc": 1.0, "args_exact": 1.0}


def test_nested_values_compare_by_value():
    expected = [call("f", '{"where": {"lat": 1.5, "lon": 2}, "tags": ["a", "b"]}')]
    assert score_calls(expected, [call("f", '{"tags": ["a", "b"], "where": {"lon": 2, "lat": 1.5}}')])["args_exact"]
    assert not score_calls(expected, [call("f", '{"tags": ["b", "a"], "where": {"lon": 2, "lat": 1.5}}')])[
        "args_exact"]  # a list's order is part of its value


def test_one_equals_one_point_zero_but_not_true_or_a_string():
    # JSON has one number type (JSON Schema's `number` takes both spellings): 1 and 1.0 are the same argument.
    expected = [call("add", '{"a": 1, "b": 2}')]
    assert score_calls(expected, [call("add", '{"a": 1.0, "b": 2.0}')])["args_exact"] == 1.0
    # Python's True == 1 must not leak in, nor the text "1".
    assert score_calls(expected, [call("add", '{"a": true, "b": 2}')])["args_exact"] == 0.0
    assert score_calls(expected, [call("add", '{"a": "1", "b": 2}')])["args_exact"] == 0.0
    assert score_calls([call("f", '{"x": null}')], [call("f", '{"x": "null"}')])["args_exact"] == 0.0


def test_wrong_name_and_wrong_arguments():
    expected = [call("get_weather", '{"city": "Seoul"}')]
    assert score_calls(expected, [call("get_time", '{"city": "Seoul"}')]) == {
        "call_rate": 1.0, "name_acc": 0.0, "args_exact": 0.0}
    assert score_calls(expected, [call("get_weather", '{"city": "Tokyo"}')]) == {
        "call_rate": 1.0, "name_acc": 1.0, "args_exact": 0.0}
    assert score_calls(expected, [call("get_weather", '{"city": "Seoul", "units": "C"}')])["args_exact"] == 0.0


def test_parallel_calls_in_another_order_are_right_but_counts_matter():
    seoul, tokyo = call("get_weather", '{"city": "Seoul"}'), call("get_weather", '{"city": "Tokyo"}')
    assert score_calls([seoul, tokyo], [tokyo, seoul]) == {"call_rate": 1.0, "name_acc": 1.0, "args_exact": 1.0}
    # a multiset: one call too few (or the same call twice) is wrong
    assert score_calls([seoul, tokyo], [seoul]) == {"call_rate": 1.0, "name_acc": 0.0, "args_exact": 0.0}
    assert score_calls([seoul, tokyo], [seoul, seoul]) == {"call_rate": 1.0, "name_acc": 1.0, "args_exact": 0.0}


def test_text_when_a_call_was_expected_and_a_call_when_text_was():
    assert score_calls([call("add", '{"a": 1, "b": 2}')], []) == {"call_rate": 0.0, "name_acc": 0.0,
                                                                  "args_exact": 0.0}
    assert score_calls([], []) == {"no_call_acc": 1.0}
    assert score_calls([], [call("add", "{}")]) == {"no_call_acc": 0.0}


def test_builtin_task_name():
    task = parse_task("toolcall_demo")
    assert (task.kind, task.target, task.name) == ("toolcall", "toolcall_eval_demo", "toolcall_demo")
    assert parse_task("toolcall:my.json").name == "toolcall:my.json"


# -- the task, with scripted answers -----------------------------------------------------------------------------

class ReplyEngine:
    """Answers each prompt with `reply(prompt text)`; records the decoding settings."""

    def __init__(self, tokenizer, reply) -> None:
        self.tokenizer, self.reply, self.params = tokenizer, reply, []

    def submit(self, prompt_ids, params, sink=None):
        request = Request(prompt_ids, params)
        request.emit(Finished("stop", len(prompt_ids), 1, self.reply(self.tokenizer.decode(prompt_ids))))
        self.params.append(params)
        return request

    def shutdown(self) -> None:
        pass


@pytest.fixture(scope="module")
def chatml_model(tiny_model_dir):
    """The tiny model with `template: chatml`, whose tool format is Qwen's/Hermes' (<tool_call> tags)."""
    from gym.eval.model import load_eval_model

    model = load_eval_model({"model_name_or_path": str(tiny_model_dir), "template": "chatml"})
    yield model
    model.close()


def reference_answers(model) -> dict[str, str]:
    """{prompt: the reference answer as the model's tool format writes it} for every turn of the demo set."""
    chat, fmt = model.chat_format, model.chat_format.tool_format
    answers = {}
    for example in read_conversations(DEMO, "data", None):
        for turn, message in enumerate(example.messages):
            if message["role"] == "assistant":
                prompt = chat.render_prompt(example.messages[:turn], example.system, tools=example.tools)
                answers[prompt] = fmt.answer_text(message["content"], message.get("tool_calls") or [])
    return answers


def run_with(model, reply, dataset=DEMO, **settings):
    engine = ReplyEngine(model.tokenizer, reply)
    model._engine = engine
    try:
        result = toolcall_task(model, dataset, "data", ToolCallSettings(log_samples=True, **settings), "toolcall_demo")
    finally:
        model._engine = None
    return result, engine


def test_reference_answers_score_full_marks(chatml_model):
    """The references themselves, written as the model would write them and read back through `extract`: 1.0
    everywhere (a file path works like a dataset name)."""
    answers = reference_answers(chatml_model)
    result, engine = run_with(chatml_model, lambda prompt: answers[prompt], max_new_tokens=64)
    metrics = result["metrics"]
    assert {metrics[m] for m in ("call_rate", "name_acc", "args_exact", "no_call_acc")} == {1.0}
    assert result["items"] == 23 and result["call_turns"] == 11 and result["conversations"] == 12
    assert result["tool_format"] == "qwen"
    assert all(p.greedy and p.max_new_tokens == 64 for p in engine.params)
    parallel = next(s for s in result["samples"] if len(s["expected"]) == 2 and isinstance(s["expected"], list))
    assert [c["arguments"]["city"] for c in parallel["predicted"]] == ["Seoul", "Tokyo"]
    assert "<tools>" in parallel["prompt"] and parallel["source"].endswith("row 4, turn 2")


def test_scripted_mistakes_are_scored(chatml_model):
    """Each call answered with its calls reversed and the first argument value changed; text answered by a call."""
    answers = reference_answers(chatml_model)
    fmt = get_tool_format("qwen")

    def reply(prompt: str) -> str:
        text = answers[prompt]
        _, calls = fmt.extract(text)
        if not calls:
            return fmt.calls_text([ToolCall("add", '{"a": 1, "b": 2}')])
        if len(calls) == 2:  # parallel: another order is still right
            return fmt.calls_text(calls[::-1])
        args = json.loads(calls[0].arguments)
        key = next(iter(args))
        if calls[0].name == "get_time":  # right name, wrong value
            args[key] = "Asia/Tokyo"
        return fmt.calls_text([ToolCall(calls[0].name, canonical_json(args))])

    result, _ = run_with(chatml_model, reply)
    metrics = result["metrics"]
    get_time_turns = sum(1 for s in result["samples"] if s.get("call_rate") is not None
                         and s["expected"][0]["name"] == "get_time")
    assert metrics["call_rate"] == 1.0 and metrics["name_acc"] == 1.0
    assert metrics["args_exact"] == pytest.approx(1 - get_time_turns / 11) and get_time_turns == 3
    assert metrics["no_call_acc"] == 0.0
    assert metrics["args_exact_stderr"] > 0 and math.isfinite(metrics["args_exact_stderr"])


def test_text_answers_to_call_turns(chatml_model):
    result, _ = run_with(chatml_model, lambda prompt: "I cannot help with that.", limit=2)
    assert result["conversations"] == 2 and result["items"] == 4
    assert result["metrics"]["call_rate"] == 0.0 and result["metrics"]["args_exact"] == 0.0
    assert result["metrics"]["no_call_acc"] == 1.0


def test_rows_without_tools_or_calls_fail_naming_the_file_and_row(chatml_model, tmp_path):
    rows = json.loads((REPO / "data" / "toolcall_eval_demo.json").read_text())
    no_tools = tmp_path / "no_tools.json"
    no_tools.write_text(json.dumps(rows[:2] + [{"conversations": rows[2]["conversations"]}]))
    with pytest.raises(DataError, match=r"no_tools\.json, row 3: .*no tools"):
        run_with(chatml_model, lambda prompt: "", dataset=str(no_tools))
    no_calls = tmp_path / "no_calls.json"
    no_calls.write_text(json.dumps([rows[7], rows[7]]))
    with pytest.raises(DataError, match=r"no_calls\.json: no assistant turn .* calls a tool"):
        run_with(chatml_model, lambda prompt: "", dataset=str(no_calls))


def test_template_without_tools_fails_with_its_reason(tiny_eval_model):
    """The tiny model's own chat template ignores tools: the task says so (ChatFormat.require_tools) before
    anything decodes."""
    with pytest.raises(DataError, match="Task toolcall_demo has tools .*template"):
        toolcall_task(tiny_eval_model, DEMO, "data", ToolCallSettings(), "toolcall_demo")
    with pytest.raises(ConfigError, match="eval_template: plain"):
        toolcall_task(tiny_eval_model, DEMO, "data", ToolCallSettings(chat=False), "toolcall_demo")


def test_bad_rows_are_named_before_a_template_that_ignores_tools(tiny_eval_model, tmp_path):
    # An empty set, or rows without tools, were reported as "has tools or tool calls, and this template ignores them".
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    with pytest.raises(DataError, match="has no rows"):
        toolcall_task(tiny_eval_model, str(empty), "data", ToolCallSettings(), "toolcall:empty")
    rows = json.loads((REPO / "data" / "toolcall_eval_demo.json").read_text())
    no_tools = tmp_path / "no_tools.json"
    no_tools.write_text(json.dumps([{"conversations": rows[2]["conversations"]}]))
    with pytest.raises(DataError, match=r"no_tools\.json, row 1: .*no tools"):
        toolcall_task(tiny_eval_model, str(no_tools), "data", ToolCallSettings(), "toolcall:no_tools")


# -- the real model, end to end ----------------------------------------------------------------------------------

def test_run_eval_on_the_embedded_model(tmp_path):
    """smollm2-135m, untrained for tools, through `run_eval` on the demo task: the metrics exist and are shares;
    what it scores is what it scores (logged, not asserted)."""
    from gym.eval.runner import run_eval

    report = run_eval({"model_name_or_path": "smollm2-135m", "template": "chatml", "tasks": ["toolcall_demo"],
                       "limit": 4, "max_new_tokens": 64, "log_samples": True, "output": str(tmp_path / "r.json")})
    result = report["results"]["toolcall_demo"]
    metrics = result["metrics"]
    assert set(metrics) >= {"call_rate", "name_acc", "args_exact", "call_rate_stderr"}
    assert all(0.0 <= metrics[m] <= 1.0 for m in ("call_rate", "name_acc", "args_exact"))
    assert metrics["args_exact"] <= metrics["name_acc"] <= metrics["call_rate"]
    assert result["conversations"] == 4 and result["items"] == 8 and len(result["samples"]) == 8
    assert json.loads((tmp_path / "r.json").read_text())["results"]["toolcall_demo"]["metrics"] == metrics
    print("smollm2-135m toolcall_demo (limit 4):", metrics)
