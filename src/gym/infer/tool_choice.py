"""Tools and structured answers at inference: which calls an answer may make, the grammars that force them, and
reading calls back out of generated text while it streams.

OpenAI's request fields, resolved for one chat turn:
- `tool_choice`: `auto` (the model may call; calls are parsed from its text), `none` (the tools are still shown in
  the prompt, as OpenAI does, but the text is all content), `required` (a grammar makes the answer one or more calls
  to offered tools) or one named function (a grammar makes the answer calls to it). Forced calls are written in the
  template family's own layout (`ToolFormat.layout`), so a forced answer is the text the model was trained to write,
  and each call's arguments follow that function's `parameters` schema.
- `response_format`: `json_object` or `json_schema` constrains the answer to JSON (of that schema). With tools the
  model may still call instead: the grammar is "an answer of that shape, or calls".

Grammars are llguidance's lark dialect (gym.infer.grammar): literals for the layout's fixed text, `%json{...}` for
arguments, so the name can only be a tool's name and the arguments can only be valid. JSON is generated in the
canonical spelling (", " and ": ", no free whitespace), the spelling tools are trained in (gym.data.tools), which
also keeps an untrained model from spending its tokens on whitespace.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from gym.core.errors import ConfigError
from gym.data.tools import CallLayout, ToolCall, ToolFormat, tool_names
from gym.infer.grammar import json_lark, lark_literal

TOOL_CHOICES = ("auto", "none", "required")


class RequestFieldError(ConfigError):
    """A chat request field that cannot be used; `field` names it (the HTTP door answers 400 with it as `param`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.reason = field, message


@dataclass(frozen=True)
class ToolChoice:
    """`mode` is auto, none, required or function (then `name` is the function's)."""

    mode: str = "auto"
    name: str | None = None

    @property
    def forced(self) -> bool:
        return self.mode in ("required", "function")

    @classmethod
    def parse(cls, value: Any, tools: list[dict[str, Any]] | None) -> ToolChoice:
        """OpenAI's `tool_choice` (a mode, or `{"type": "function", "function": {"name": ...}}`) for these tools.
        Without tools only `none` (and the default, auto) make sense: forcing a call to nothing is an error."""
        if value is None:
            return cls()
        if isinstance(value, str):
            if value not in TOOL_CHOICES:
                raise RequestFieldError("tool_choice", f"must be one of {', '.join(TOOL_CHOICES)} or "
                                                       '{"type": "function", "function": {"name": ...}}, got '
                                                       f"{value!r}.")
            choice = cls(value)
        else:
            function = value.get("function") if isinstance(value, dict) else None
            name = function.get("name") if isinstance(function, dict) else None
            if not isinstance(name, str) or value.get("type", "function") != "function":
                raise RequestFieldError("tool_choice", 'a named choice is {"type": "function", "function": '
                                                       '{"name": "<one of the tools>"}}.')
            choice = cls("function", name)
        offered = tool_names(tools or [])
        if choice.forced and not offered:
            raise RequestFieldError("tool_choice", f"{choice.name or choice.mode!r} forces a tool call, but the "
                                                   "request offers no tools: send `tools` too.")
        if choice.name is not None and choice.name not in offered:
            raise RequestFieldError("tool_choice", f"names the function {choice.name!r}, which is not among the "
                                                   f"tools ({', '.join(offered)}).")
        return choice


def answer_schema(response_format: Any) -> dict[str, Any] | None:
    """OpenAI's `response_format` -> the JSON schema an answer must follow (`{"type": "object"}` for json_object);
    None for text. The schema itself is checked by the grammar (gym.infer.grammar), which knows what it supports."""
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise RequestFieldError("response_format", 'json_schema needs {"json_schema": {"name": ..., '
                                                       '"schema": {...}}} with the schema an object.')
        return schema
    raise RequestFieldError("response_format", f"type must be text, json_object or json_schema, got {kind!r}.")


def _call_rule(pattern: str, name: str, args_rule: str, special_tokens: Collection[str]) -> str:
    """A call pattern ("...{name}...{arguments}...") as a lark expression with the name fixed."""
    before, found, after = pattern.replace("{name}", name).partition("{arguments}")
    if not found:  # no format writes a call without its arguments; a layout that did would be a bug
        raise ValueError(f"call layout {pattern!r} has no {{arguments}}")
    return " ".join(part for part in (lark_literal(before, special_tokens) if before else "", args_rule,
                                      lark_literal(after, special_tokens) if after else "") if part)


def calls_grammar(layout: CallLayout, tools: list[dict[str, Any]], *, parallel: bool,
                  answer: dict[str, Any] | None = None, special_tokens: Collection[str] = ()) -> str:
    """The lark grammar of an answer that is calls to `tools` (any of them; give one to force that one), laid out as
    `layout` writes them: one call, or several joined by the layout's separator when `parallel` and the format
    allows. `answer`: a JSON schema the answer may follow instead of calling (response_format with tools); only
    where `answer_or_calls(layout)`. `special_tokens`: the tokenizer's, written as tokens where the layout's text
    holds them (a Qwen model writes `<tool_call>` as one token; gym.infer.grammar.lark_literal)."""
    def literal(text: str) -> str:
        return lark_literal(text, special_tokens) if text else ""

    rules = []
    for i, tool in enumerate(tools):
        function = tool["function"]
        rules.append(f"args_{i}: {json_lark(function.get('parameters') or {'type': 'object'})}")
        rules.append(f"call_{i}: {_call_rule(layout.call, function['name'], f'args_{i}', special_tokens)}")
        if layout.single is not None:
            rules.append(f"single_{i}: {_call_rule(layout.single, function['name'], f'args_{i}', special_tokens)}")
    rules.append("call: " + " | ".join(f"call_{i}" for i in range(len(tools))))
    several = parallel and layout.parallel
    listed = " ".join(p for p in (literal(layout.prefix), "call",
                                  f"({literal(layout.separator)} call)*" if several else "",
                                  literal(layout.suffix)) if p)
    if layout.single is not None:
        rules.append("single: " + " | ".join(f"single_{i}" for i in range(len(tools))))
        calls = f"single | {listed}" if several else "single"
    else:
        calls = listed
    start = f"start: {calls}"
    if answer is not None:
        rules.append(f"answer: {json_lark(answer)}")
        start = f"start: answer | {calls}"
    return "\n".join([start, *rules]) + "\n"


def answer_or_calls(layout: CallLayout) -> bool:
    """Whether an answer in a response_format can be offered beside calls in one grammar: not where calls are bare
    JSON (llama3), which llguidance's lexer cannot tell from the answer as it begins."""
    return not layout.call.startswith(("{", "["))


def offered(tools: list[dict[str, Any]], choice: ToolChoice) -> list[dict[str, Any]]:
    """The tools a forced answer may call: the named one, or all."""
    return [t for t in tools if t["function"]["name"] == choice.name] if choice.name else tools


@dataclass
class Reply:
    """One finished answer: its text (calls taken out), its calls, and why it ended (`tool_calls` when it called)."""

    content: str
    calls: list[ToolCall]
    finish_reason: str
    completion_tokens: int = 0


class CallStream:
    """Splits an answer arriving piece by piece into content to show now and text held back because it is, or may
    still become, a call (`ToolFormat.hold_from`). At the end, `finish` parses the held text: calls, or, when it is
    not a valid call, the rest of the content, so a broken call reaches the user as text, never as an error."""

    def __init__(self, tool_format: ToolFormat | None) -> None:
        self.tool_format = tool_format
        self.text = ""
        self.sent = 0

    def feed(self, piece: str) -> str:
        """The content that can be shown now (possibly empty)."""
        self.text += piece
        if self.tool_format is None:
            safe = len(self.text)
        else:  # trailing whitespace too: a call's text drops the whitespace before it, so the stream must not send it
            safe = len(self.text[:self.tool_format.hold_from(self.text)].rstrip())
        safe = max(self.sent, safe)
        out, self.sent = self.text[self.sent:safe], safe
        return out

    def finish(self) -> tuple[str, list[ToolCall]]:
        """(the content not shown yet, the calls)."""
        content, calls = self.tool_format.extract(self.text) if self.tool_format is not None else (self.text, [])
        if not calls:
            return self.text[self.sent:], []
        shown = self.text[:self.sent]
        return (content[len(shown):] if content.startswith(shown) else ""), calls


def parse_reply(tool_format: ToolFormat | None, text: str, reason: str, completion_tokens: int = 0) -> Reply:
    """A whole answer -> Reply: the calls `tool_format` reads in it (none without one) and the content around them."""
    stream = CallStream(tool_format)
    stream.text = text
    content, calls = stream.finish()
    return Reply(content, calls, "tool_calls" if calls else reason, completion_tokens)


def describe_calls(calls: Iterable[ToolCall]) -> str:
    """Calls as a person reads them: `name({"arg": 1})`, one a line (gym chat)."""
    return "\n".join(f"-> {call.name}({call.arguments})" for call in calls)
