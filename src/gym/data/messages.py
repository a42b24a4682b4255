"""The internal message shape, and reading conversations into it (dataset rows and OpenAI requests alike).

A conversation is a list of plain dicts that alternate a prompt turn and an answer turn:

    {"role": "user", "content": str}
    {"role": "assistant", "content": str, "tool_calls": list[ToolCall]}   # "tool_calls" absent or empty: no calls
    {"role": "observation", "content": str}                                 # one tool result
    {"role": "observation", "content": str, "results": list[str],          # parallel results: each one, in order;
     "tool_call_ids": list[str | None]}                                     # content is them joined by newlines

An answer that calls tools is an assistant turn holding the calls (LLaMA-Factory's `function_call` turn and
OpenAI's `tool_calls` become the same thing), and the results that come back are one observation turn, however
many there are, so prompt and answer keep alternating. The templates render an observation turn's results the way
each family renders several `tool` messages (gym.data.templates).

Reading is shared by the dataset path (gym.data.formats, errors name the file and row) and the serving path
(`messages_from_openai`, errors name the request's message index), so a row and a request that say the same thing
become the same messages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gym.core.errors import DataError
from gym.core.names import closest
from gym.data.tools import ToolCall, ToolError, parse_call, parse_calls

USER, ASSISTANT, OBSERVATION, FUNCTION = "user", "assistant", "observation", "function"
SYSTEM = "system"

Message = dict[str, Any]


class MessageProblem(ValueError):
    """A message that cannot be read: `field` is where (e.g. `conversations[3].value`), the text says what."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field} {problem}")
        self.field, self.problem = field, problem


@dataclass(frozen=True)
class Tags:
    """Which keys and role names a dataset uses (LLaMA-Factory's `tags`); `roles` maps a role name to ours
    (user, assistant, observation, function, system)."""

    role: str
    content: str
    roles: Mapping[str, str]


OPENAI = Tags("role", "content", {"system": SYSTEM, "developer": SYSTEM, "user": USER, "assistant": ASSISTANT,
                                  "tool": OBSERVATION, "function_call": FUNCTION})


def tool_results(message: Mapping[str, Any]) -> list[str]:
    """An observation turn's results, one per call answered."""
    results = message.get("results")
    return list(results) if results else [message["content"]]


def tool_calls(message: Mapping[str, Any]) -> list[ToolCall]:
    calls = message.get("tool_calls")
    return list(calls) if calls else []


def _text(value: Any, field: str, *, allow_none: bool = False) -> str:
    """Message content: a string, or OpenAI's list of text parts (joined)."""
    if value is None and allow_none:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                       and isinstance(p.get("text"), str) for p in value):
        return "".join(p["text"] for p in value)
    raise MessageProblem(field, f"must be a string, got {type(value).__name__}.")


def _calls(value: Any, field: str) -> list[ToolCall]:
    if not isinstance(value, list) or not value:
        raise MessageProblem(field, "must be a non-empty list of calls.")
    calls = []
    for j, call in enumerate(value):
        try:
            calls.append(parse_call(call))
        except ToolError as e:
            raise MessageProblem(f"{field}[{j}]", f"is not a valid call: {e}.") from None
    return calls


def read_conversation(raw: Any, tags: Tags, column: str,
                      join_user_turns: bool = False) -> tuple[str | None, list[Message]]:
    """A list of role/content messages -> (the system prompt if the first message is one, alternating messages).

    `join_user_turns`: consecutive user messages become one turn, their texts joined by a blank line (what a
    client sending "context" then "question" means); otherwise they are an alternation error (training data).

    Raises MessageProblem naming the field (`{column}[i].{key}`). Consecutive tool results are merged into one
    observation turn; a `function_call` turn's content is parsed as one call or a JSON list of parallel calls."""
    if not isinstance(raw, list) or not raw:
        raise MessageProblem(column, "must be a non-empty list of messages.")
    system: str | None = None
    messages: list[Message] = []
    for i, message in enumerate(raw):
        where = f"{column}[{i}]"
        if not isinstance(message, dict):
            raise MessageProblem(where, "must be an object with role and content.")
        role = tags.roles.get(message.get(tags.role, ""))
        content_field = f"{where}.{tags.content}"
        if tags.content not in message and role is not None and not (role == ASSISTANT and message.get("tool_calls")):
            keys = ", ".join(repr(k) for k in message)
            misspelt = next((str(k) for k in message if k != tags.role and closest(str(k), [tags.content])), None)
            hint = f" Is {misspelt!r} meant to be {tags.content!r}?" if misspelt else ""
            raise MessageProblem(where, f"has no {tags.content!r} key (its keys: {keys}).{hint}")
        if role == SYSTEM and i == 0:
            system = _text(message.get(tags.content), content_field)
            continue
        if role == SYSTEM:
            raise MessageProblem(f"{where}.{tags.role}", "is a system message after the first: a conversation's "
                                 "system prompt is its first message, and is given once.")
        if role is None:
            expected = ", ".join(repr(r) for r, ours in tags.roles.items() if ours != SYSTEM)
            firsts = [r for r, ours in tags.roles.items() if ours == SYSTEM]
            if firsts:
                expected += f" (and {firsts[0]!r}, as the first message only)"
            if tags.role not in message:
                keys = ", ".join(repr(k) for k in message) or "none"
                raise MessageProblem(where, f"has no {tags.role!r} key (its keys: {keys}); say which keys hold "
                                     "the role and the text in dataset_info.json's `tags` (role_tag, content_tag), "
                                     "or use `\"formatting\": \"openai\"` for role/content messages.")
            raise MessageProblem(f"{where}.{tags.role}",
                                 f"has unknown role {message.get(tags.role)!r}; expected one of {expected}.")
        if role == OBSERVATION:
            result = _text(message.get(tags.content), content_field)
            call_id = message.get("tool_call_id")
            if messages and messages[-1]["role"] == OBSERVATION:  # a parallel call's next result
                _add_result(messages[-1], result, call_id if isinstance(call_id, str) else None)
                continue
            turn: Message = {"role": OBSERVATION, "content": result}
            if isinstance(call_id, str):
                turn["tool_call_ids"] = [call_id]
            messages.append(turn)
        elif role == FUNCTION:
            content = _text(message.get(tags.content), content_field)
            try:
                calls = parse_calls(content)
            except ToolError as e:
                raise MessageProblem(content_field, f"is not a valid tool call: {e}.") from None
            messages.append({"role": ASSISTANT, "content": "", "tool_calls": calls})
        elif role == ASSISTANT and message.get("tool_calls"):
            calls = _calls(message["tool_calls"], f"{where}.tool_calls")
            content = _text(message.get(tags.content), content_field, allow_none=True)
            messages.append({"role": ASSISTANT, "content": content, "tool_calls": calls})
        elif join_user_turns and role == USER and messages and messages[-1]["role"] == USER:
            messages[-1]["content"] += "\n\n" + _text(message.get(tags.content), content_field)
            continue
        else:
            messages.append({"role": role, "content": _text(message.get(tags.content), content_field)})
        expect_prompt = len(messages) % 2 == 1  # the turn just added
        if expect_prompt != (messages[-1]["role"] in (USER, OBSERVATION)):
            # named as the data names them ('user' or 'tool' in OpenAI's rows, 'human' or 'observation' in ShareGPT's)
            wanted = (USER, OBSERVATION) if expect_prompt else (ASSISTANT, FUNCTION)
            want = " or ".join(repr(r) for r, ours in tags.roles.items() if ours in wanted)
            raise MessageProblem(f"{where}.{tags.role}", f"is {message.get(tags.role)!r} but turns must alternate; "
                                 f"expected {want} here.")
    return system, messages


def _add_result(turn: Message, result: str, call_id: str | None) -> None:
    results = tool_results(turn)
    ids = turn.get("tool_call_ids") or [None] * len(results)
    turn["results"] = [*results, result]
    turn["tool_call_ids"] = [*ids, call_id]
    turn["content"] = "\n".join(turn["results"])
    if not any(turn["tool_call_ids"]):
        del turn["tool_call_ids"]


def messages_from_openai(messages: Sequence[Mapping[str, Any]]) -> tuple[str | None, list[Message]]:
    """An OpenAI chat request's `messages` -> (system prompt, internal messages), for serving.

    Assistant messages may carry `tool_calls` (arguments as a JSON string or an object), `tool` messages their
    results (consecutive ones become one observation turn); consecutive user messages are one turn, their texts
    joined by a blank line, as before tools came. Raises DataError naming the message, e.g.
    `messages[2].tool_calls[0] is not a valid call: arguments are not valid JSON ...`."""
    try:
        return read_conversation(list(messages), OPENAI, "messages", join_user_turns=True)
    except MessageProblem as e:
        raise DataError(str(e)) from None


def messages_to_openai(messages: Sequence[Mapping[str, Any]], system: str | None = None) -> list[dict[str, Any]]:
    """Internal messages -> OpenAI-shaped ones (the inverse of `messages_from_openai`), e.g. to log or replay."""
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for m in messages:
        if m["role"] == OBSERVATION:
            ids = m.get("tool_call_ids") or [None] * len(tool_results(m))
            for result, call_id in zip(tool_results(m), ids):
                out.append({"role": "tool", "content": result, **({"tool_call_id": call_id} if call_id else {})})
        elif m["role"] == ASSISTANT and tool_calls(m):
            out.append({"role": "assistant", "content": m["content"] or None,
                        "tool_calls": [c.openai() for c in tool_calls(m)]})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return out
