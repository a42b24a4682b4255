"""Tool-call tasks (`--task toolcall:<data>`): does the model call the right functions with the right arguments?

Every assistant turn of a held-out conversation is one item. Its prompt is the conversation before it (earlier
calls and tool results included), rendered with the row's tools through the model's own chat format, as training
and serving render it; the model answers greedily through the same engine as chat and the API (all items decode
in batches), and the answer is read back with the chat format's tool format (`ToolFormat.extract`, what the API's
tool-call parsing uses), so a call the server would return is a call here.

Turns whose reference calls tools are scored on three metrics:

    call_rate   the model made any call at all
    name_acc    the called function names equal the reference's, as a multiset (parallel calls in any order)
    args_exact  the calls equal the reference's, names and arguments, as a multiset, arguments compared after
                JSON normalisation: both sides are parsed and compared as values, so key order and whitespace
                do not matter. Numbers compare by value (1 equals 1.0: JSON has one number type and JSON Schema's
                `number` accepts both), but a boolean is not a number (true is not 1) and "1" is not 1.

Turns whose reference is text score `no_call_acc`: the model answered without calling. Each metric is a mean
over its turns, with its standard error. Decoding is greedy and zero-shot (`n_shot` does not apply); `limit`
counts conversations, not turns.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

from gym.core.errors import ConfigError, DataError
from gym.core.kinds import DataKind
from gym.core.stats import mean_and_stderr
from gym.data.formats import Example
from gym.data.loader import load_examples
from gym.data.messages import ASSISTANT, tool_calls
from gym.data.registry import get_dataset_attrs
from gym.data.tools import ToolCall
from gym.eval.model import EvalModel
from gym.infer.batch import final_text
from gym.infer.requests import Request


@dataclass
class ToolCallSettings:
    chat: bool = True
    limit: int | None = None
    max_new_tokens: int = 256
    log_samples: bool = False


def _normal(value: Any) -> Any:
    """A JSON value as a hashable value whose equality is the comparison the module docstring defines.

    Tagging each kind keeps Python's own equalities from leaking in (True == 1 and hash(True) == hash(1)), while
    ("num", 1) == ("num", 1.0) keeps 1 and 1.0 equal."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, (int, float)):
        return ("num", value)
    if isinstance(value, dict):
        return ("obj", frozenset((key, _normal(item)) for key, item in value.items()))
    if isinstance(value, list):
        return ("arr", tuple(_normal(item) for item in value))
    return ("str" if isinstance(value, str) else "null", value)


def _call_key(call: ToolCall) -> tuple[str, Any]:
    try:
        arguments = json.loads(call.arguments)
    except (json.JSONDecodeError, RecursionError):  # not from extract or a data row, which hold valid JSON
        return call.name, ("text", call.arguments)
    return call.name, _normal(arguments)


def score_calls(expected: list[ToolCall], predicted: list[ToolCall]) -> dict[str, float]:
    """One turn's scores. Expected calls: call_rate, name_acc and args_exact; expected text (no calls): no_call_acc."""
    if not expected:
        return {"no_call_acc": float(not predicted)}
    return {"call_rate": float(bool(predicted)),
            "name_acc": float(Counter(c.name for c in expected) == Counter(c.name for c in predicted)),
            "args_exact": float(Counter(map(_call_key, expected)) == Counter(map(_call_key, predicted)))}


def read_conversations(dataset: str, dataset_dir: str, limit: int | None) -> list[Example]:
    """The held-out conversations; a DataError naming the file and row for a row without tools.

    A row with tools and no call is kept: its text answers are the `no_call_acc` items (does the model hold back
    when no offered function fits?). Data with no call anywhere is not tool-call data, and fails naming the file."""
    examples: list[Example] = []
    for attr in get_dataset_attrs(dataset, dataset_dir):
        examples += load_examples(attr, DataKind.SUPERVISED)
    examples = examples[:limit] if limit else examples
    for example in examples:
        if not example.tools:
            raise DataError(f"{example.source}: a toolcall task needs the functions the conversation offers; this "
                            "row has no tools (map the column with `\"columns\": {\"tools\": ...}` in "
                            "dataset_info.json).")
    if not any(tool_calls(m) for e in examples for m in e.messages):
        files = sorted({e.source.rsplit(", ", 1)[0] for e in examples})
        raise DataError(f"{', '.join(files)}: no assistant turn of the {len(examples)} rows scored calls a tool, so "
                        "there is no call to score (a toolcall task needs function_call / tool_calls turns).")
    return examples


def _calls_json(calls: list[ToolCall]) -> list[dict[str, Any]]:
    return [{"name": c.name, "arguments": json.loads(c.arguments)} for c in calls]


def toolcall_task(model: EvalModel, dataset: str, dataset_dir: str, settings: ToolCallSettings,
                  name: str = "toolcall") -> dict[str, Any]:
    # the rows first: an empty set, or rows without tools, were reported as a chat template that ignores tools
    examples = read_conversations(dataset, dataset_dir, settings.limit)
    chat = model.chat_format
    if not settings.chat or chat is None:
        why = ("eval_template: plain asks for plain text; leave it at auto or chat" if chat is not None else
               "this model has no chat template; set `template:` (e.g. qwen, llama3)")
        raise ConfigError(f"Task {name} offers tools in the model's chat format, but {why}.")
    fmt = chat.require_tools(f"Task {name}")
    if fmt is None:
        raise ConfigError(f"Task {name}: the chat template renders tools, but its calls are in none of Gym's tool "
                          "formats, so answers cannot be read back. Set `tool_format:`.")
    items: list[tuple[Example, int, str, Request]] = []
    for example in examples:
        for turn, message in enumerate(example.messages):
            if message["role"] != ASSISTANT:
                continue
            prompt = chat.render_prompt(example.messages[:turn], example.system, tools=example.tools)
            ids = list(model.tokenizer.encode(prompt, add_special_tokens=False))
            params = model.sampling_params(do_sample=False, max_new_tokens=settings.max_new_tokens)
            items.append((example, turn, prompt, model.engine.submit(ids, params)))
    per_metric: dict[str, list[float]] = {"call_rate": [], "name_acc": [], "args_exact": [], "no_call_acc": []}
    samples: list[dict[str, Any]] = []
    for example, turn, prompt, request in items:
        answer = final_text(request).strip()
        _, predicted = fmt.extract(answer)
        expected = tool_calls(example.messages[turn])
        scores = score_calls(expected, predicted)
        for metric, value in scores.items():
            per_metric[metric].append(value)
        samples.append({"source": f"{example.source}, turn {turn + 1}", "prompt": prompt, "answer": answer,
                        "expected": _calls_json(expected) if expected else example.messages[turn]["content"],
                        "predicted": _calls_json(predicted), **scores})
    metrics: dict[str, float] = {}
    for metric, values in per_metric.items():
        if values:  # no_call_acc only where some reference turn is text
            metrics[metric], metrics[f"{metric}_stderr"] = mean_and_stderr(values)
    result: dict[str, Any] = {"kind": "toolcall", "prompt": "chat", "n_shot": 0, "items": len(items),
                              "conversations": len(examples), "call_turns": len(per_metric["call_rate"]),
                              "metric_items": {metric: len(values) for metric, values in per_metric.items() if values},
                              "tool_format": fmt.name, "max_new_tokens": settings.max_new_tokens,
                              "metrics": metrics}
    if settings.log_samples:
        result["samples"] = samples
    return result
