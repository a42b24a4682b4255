"""alpaca / sharegpt / openai rows -> one internal form, `Example`.

Every check names the file, the row and the field, because a user with a 50,000-row file needs to
find the one bad row. Which fields are required depends on the data kind the method asks for:
`unsupervised` (pt) needs text, `supervised` (sft) needs at least one assistant answer, `pairwise`
(rm, dpo family) a prompt with a chosen and a rejected answer, `feedback` (kto) an answer and a
desirable/undesirable tag, `prompt` (grpo, rloo, ppo) a prompt ending with a user turn and
optionally a reference answer for verifiable rewards.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal, overload

from gym.core.errors import DataError
from gym.data.readers import RowSource
from gym.data.registry import DatasetAttr

USER, ASSISTANT, OBSERVATION, FUNCTION = "user", "assistant", "observation", "function"


@dataclass
class Example:
    """One conversation: alternating user/assistant messages, plus what some methods add."""

    source: str
    messages: list[dict[str, str]] = field(default_factory=list)
    system: str | None = None
    tools: str | None = None
    chosen: str | None = None  # pairwise: the preferred and the dispreferred next answer
    rejected: str | None = None
    kto_tag: bool | None = None  # feedback: is the last answer desirable?
    answer: str | None = None  # prompt: the reference answer verifiable rewards compare with


def _fail(source: RowSource, field_name: str, problem: str) -> DataError:
    return DataError(f"{source}: field '{field_name}' {problem}")


def _required_column(attr: DatasetAttr, source: RowSource, key: str) -> str:
    column = attr.column(key)
    if column is None:
        raise DataError(f"{source}: dataset '{attr.name}' maps no '{key}' column.")
    return column


@overload
def _string(source: RowSource, row: dict[str, Any], column: str, *, required: Literal[True]) -> str: ...
@overload
def _string(source: RowSource, row: dict[str, Any], column: str, *, required: bool) -> str | None: ...
def _string(source: RowSource, row: dict[str, Any], column: str, *, required: bool) -> str | None:
    if column not in row or row[column] is None:
        if required:
            raise _fail(source, column, "is missing.")
        return None
    value = row[column]
    if not isinstance(value, str):
        raise _fail(source, column, f"must be a string, got {type(value).__name__} {str(value)[:40]!r}.")
    if required and not value.strip():
        raise _fail(source, column, "is empty.")
    return value


def convert_row(attr: DatasetAttr, source: RowSource, row: Any, kind: str) -> Example:
    if not isinstance(row, dict):
        raise DataError(f"{source}: expected an object with named fields, got {type(row).__name__}.")
    _check_columns_for(attr, kind)
    if attr.formatting == "alpaca":
        example = _convert_alpaca(attr, source, row, kind)
    else:
        example = _convert_sharegpt(attr, source, row, kind)
    if kind == "pairwise":
        example.chosen = _answer_text(attr, source, row, "chosen")
        example.rejected = _answer_text(attr, source, row, "rejected")
    elif kind == "feedback":
        example.kto_tag = _kto_tag(source, row, _required_column(attr, source, "kto_tag"))
    elif kind == "prompt" and (answer_col := attr.column("answer")):
        example.answer = _reference_answer(source, row, answer_col)
    return example


_NEEDED_COLUMNS = {
    "pairwise": (("chosen", "rejected"), "set `\"ranking\": true` and map `columns: {chosen: ..., rejected: ...}`"),
    "feedback": (("kto_tag",), "map `columns: {kto_tag: <the column holding true/false>}`"),
}


def _check_columns_for(attr: DatasetAttr, kind: str) -> None:
    if kind not in _NEEDED_COLUMNS:
        return
    needed, how = _NEEDED_COLUMNS[kind]
    missing = [c for c in needed if not attr.column(c)]
    if missing:
        what = "preference pairs" if kind == "pairwise" else "desirable/undesirable labels"
        raise DataError(f"Dataset '{attr.name}' has no {what} (no '{missing[0]}' column): in dataset_info.json, {how}.")


def _answer_text(attr: DatasetAttr, source: RowSource, row: dict[str, Any], key: str) -> str:
    """A chosen/rejected answer: a plain string (alpaca), or one message object (sharegpt/openai)."""
    column = _required_column(attr, source, key)
    value = row.get(column)
    if isinstance(value, dict) and attr.formatting != "alpaca":
        content = value.get(attr.tag("content_tag"))
        if not isinstance(content, str) or not content.strip():
            raise _fail(source, f"{column}.{attr.tag('content_tag')}", "must be a non-empty string.")
        return content
    if isinstance(value, list) and value and isinstance(value[-1], dict) and attr.formatting != "alpaca":
        return _answer_text(attr, source, {column: value[-1]}, key)
    return _string(source, row, column, required=True)


def _kto_tag(source: RowSource, row: dict[str, Any], column: str) -> bool:
    value = row.get(column)
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise _fail(source, column, f"must be true or false (desirable or not), got {value!r}.")


def _reference_answer(source: RowSource, row: dict[str, Any], column: str) -> str:
    value = row.get(column)
    if isinstance(value, bool) or value is None:
        raise _fail(source, column, "is missing." if value is None else f"must be a string or number, got {value!r}.")
    if isinstance(value, (int, float)):
        return str(value)
    if not isinstance(value, str):
        raise _fail(source, column, f"must be a string or number, got {type(value).__name__}.")
    return value


def _convert_alpaca(attr: DatasetAttr, source: RowSource, row: dict[str, Any], kind: str) -> Example:
    prompt_col, query_col, response_col = attr.column("prompt"), attr.column("query"), attr.column("response")
    prompt = _string(source, row, prompt_col, required=True) if prompt_col else None
    query = _string(source, row, query_col, required=False) if query_col else None
    user_text = "\n".join(part for part in (prompt, query) if part)
    messages: list[dict[str, str]] = []
    history_col = attr.column("history")
    if history_col and row.get(history_col):
        history = row[history_col]
        if not isinstance(history, list):
            raise _fail(source, history_col, "must be a list of [instruction, response] pairs.")
        for turn_no, pair in enumerate(history):
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(p, str) for p in pair)):
                raise _fail(source, f"{history_col}[{turn_no}]", "must be a pair of strings [instruction, response].")
            messages += [{"role": USER, "content": pair[0]}, {"role": ASSISTANT, "content": pair[1]}]
    messages.append({"role": USER, "content": user_text})
    response_required = kind in ("supervised", "feedback")
    response = None
    if response_col and kind not in ("pairwise", "prompt"):
        response = _string(source, row, response_col, required=response_required)
    if response_required and response_col is None:
        raise DataError(f"{source}: dataset '{attr.name}' maps no 'response' column, which {kind} data needs.")
    if response is not None:
        messages.append({"role": ASSISTANT, "content": response})
    system_col = attr.column("system")
    system = _string(source, row, system_col, required=False) if system_col else None
    return Example(source=str(source), messages=messages, system=system)


def _convert_sharegpt(attr: DatasetAttr, source: RowSource, row: dict[str, Any], kind: str) -> Example:
    column = _required_column(attr, source, "messages")
    if column not in row:
        raise _fail(source, column, "is missing.")
    raw = row[column]
    if not isinstance(raw, list) or not raw:
        raise _fail(source, column, "must be a non-empty list of messages.")
    role_tag, content_tag = attr.tag("role_tag"), attr.tag("content_tag")
    roles = {
        attr.tag("user_tag"): USER, attr.tag("assistant_tag"): ASSISTANT,
        attr.tag("observation_tag"): OBSERVATION, attr.tag("function_tag"): FUNCTION,
    }
    if (attr.tag("user_tag"), attr.tag("assistant_tag")) == ("human", "gpt"):
        # ShareGPT files in the wild (the Gym documents' own example among them) write "from": "user"/"assistant" too
        roles.setdefault("user", USER)
        roles.setdefault("assistant", ASSISTANT)
    system_col = attr.column("system")
    system = _string(source, row, system_col, required=False) if system_col else None
    messages: list[dict[str, str]] = []
    for i, message in enumerate(raw):
        where = f"{column}[{i}]"
        if not isinstance(message, dict):
            raise _fail(source, where, "must be an object with role and content.")
        role = message.get(role_tag)
        content = message.get(content_tag)
        if role == attr.tag("system_tag") and i == 0:
            if not isinstance(content, str):
                raise _fail(source, f"{where}.{content_tag}", "must be a string.")
            system = content
            continue
        if role not in roles:
            expected = ", ".join(repr(r) for r in roles)
            raise _fail(source, f"{where}.{role_tag}", f"has unknown role {role!r}; expected one of {expected}.")
        if not isinstance(content, str):
            raise _fail(source, f"{where}.{content_tag}", f"must be a string, got {type(content).__name__}.")
        expect_prompt = len(messages) % 2 == 0
        if expect_prompt != (roles[role] in (USER, OBSERVATION)):
            want = "user/observation" if expect_prompt else "assistant/function"
            raise _fail(source, f"{where}.{role_tag}", f"is {role!r} but turns must alternate; expected {want} here.")
        messages.append({"role": roles[role], "content": content})
    ends_with_answer = bool(messages) and messages[-1]["role"] in (ASSISTANT, FUNCTION)
    if kind in ("supervised", "feedback") and not ends_with_answer:
        raise _fail(source, column, f"must end with an assistant message for {kind} data.")
    if kind == "prompt" and ends_with_answer:
        messages = messages[:-1]  # an answer in the row is not part of the prompt
    if kind in ("pairwise", "prompt") and (not messages or messages[-1]["role"] not in (USER, OBSERVATION)):
        raise _fail(source, column, f"must end with a user message for {kind} data (the answers come separately).")
    tools_col = attr.column("tools")
    tools = row.get(tools_col) if tools_col else None
    if tools is not None and not isinstance(tools, str):
        tools = json.dumps(tools, ensure_ascii=False)
    return Example(source=str(source), messages=messages, system=system, tools=tools)
