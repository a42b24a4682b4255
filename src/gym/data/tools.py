"""Tool calling: the functions a conversation offers, the calls an answer makes, and each model family's text for them.

One internal form for every shape users bring (LLaMA-Factory's `function_call` turns, OpenAI's `tool_calls`):
`ToolSpec` lists and `ToolCall`s. A `ToolFormat` is one family's text, as LLaMA-Factory defines it for its
templates (src/llamafactory/data/tool_utils.py): how the offered tools are described in the system turn, how an
answer's calls are written, and how calls are read back out of generated text (the inverse, as vLLM's tool
parsers do). Reading back never raises: text that is not a valid call stays text.

Arguments are kept as JSON text in the canonical spelling `json.dumps(value, ensure_ascii=False)` (separators
", " and ": "), the spelling LLaMA-Factory trains and transformers' `tojson` serves, so a call renders the same
whether it came from a data row, an OpenAI request or the model.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

# Llama 3.1's chat template writes today's date into the tool prompt; a fixed one (that template's own default)
# keeps training text reproducible.
LLAMA3_DATE = "26 Jul 2024"


class ToolError(ValueError):
    """A tool list or a call that cannot be used; the message says what, the caller says where (file, row, field)."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str
    """The arguments object as canonical JSON text (see the module docstring)."""
    id: str | None = None

    @property
    def arguments_value(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.arguments)
        return value

    def openai(self, index: int | None = None) -> dict[str, Any]:
        """The OpenAI `tool_calls` entry (arguments as a JSON string, as OpenAI sends them)."""
        entry: dict[str, Any] = {"id": self.id or new_call_id(), "type": "function",
                                 "function": {"name": self.name, "arguments": self.arguments}}
        if index is not None:
            entry["index"] = index
        return entry

    def hf(self) -> dict[str, Any]:
        """The entry a transformers chat template expects: arguments as a mapping (templates apply `tojson`)."""
        entry: dict[str, Any] = {"type": "function", "function": {"name": self.name,
                                                                   "arguments": self.arguments_value}}
        if self.id:
            entry["id"] = self.id
        return entry


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def canonical_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# -- reading what users bring ------------------------------------------------------------------------------------

# What a function name cannot hold: each family writes the name as is into its call text (inside a JSON string for
# qwen, llama3 and mistral; before a newline for glm4 and default), so a quote, a backslash or whitespace makes a call
# no parser reads back, and a brace can spell a layout's `{arguments}`. OpenAI allows only letters, digits, _ and -.
_BAD_NAME = re.compile(r'[\s"\\{}\x00-\x1f\x7f]')


def _bad_name(name: str) -> str | None:
    """The reason `name` cannot be a function's name, or None."""
    bad = _BAD_NAME.search(name)
    if bad:
        return (f"function name {name!r} holds {bad.group()!r}, which a call's text cannot carry (no whitespace, "
                "quotes, backslashes or braces; OpenAI's names are letters, digits, '_' and '-')")
    return None


def parse_tools(value: Any) -> list[dict[str, Any]]:
    """A tools column or request field (a JSON string or a list; each tool OpenAI-wrapped
    `{"type": "function", "function": {...}}` or bare `{"name": ..., "parameters": ...}`) -> OpenAI-wrapped tools."""
    if isinstance(value, str):
        if not value.strip():
            return []
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ToolError(f"is not valid JSON ({e.msg} at character {e.pos})") from None
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        raise ToolError(f"must be a list of functions, got {type(value).__name__}")
    tools = []
    for i, tool in enumerate(value):
        if not isinstance(tool, dict):
            raise ToolError(f"[{i}] must be an object describing a function, got {type(tool).__name__}")
        function = tool.get("function") if tool.get("type") == "function" else tool
        if not isinstance(function, dict):
            raise ToolError(f"[{i}].function must be an object")
        name = function.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ToolError(f"[{i}] has no function name")
        problem = _bad_name(name)
        if problem:
            raise ToolError(f"[{i}] {problem}")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise ToolError(f"[{i}].parameters of {name!r} must be a JSON schema object")
        tools.append({"type": "function", "function": {**function, "parameters": parameters}})
    return tools


def tool_names(tools: list[dict[str, Any]]) -> list[str]:
    return [tool["function"]["name"] for tool in tools]


def _arguments_text(arguments: Any) -> str:
    """OpenAI sends arguments as a JSON string; LLaMA-Factory's rows hold an object. Either way: canonical text of
    an object."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
            raise ToolError(f"arguments are not valid JSON ({e.msg} at character {e.pos})") from None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ToolError(f"arguments must be a JSON object, got {type(arguments).__name__}")
    return canonical_json(arguments)


def parse_call(value: Any) -> ToolCall:
    """One call: LLaMA-Factory's `{"name", "arguments"}` or OpenAI's `{"id", "type", "function": {...}}`."""
    if not isinstance(value, dict):
        raise ToolError(f"a call must be an object with a name and arguments, got {type(value).__name__}")
    function: dict[str, Any] = value["function"] if isinstance(value.get("function"), dict) else value
    name = function.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ToolError("a call has no function name")
    problem = _bad_name(name)
    if problem:
        raise ToolError(f"a call's {problem}")
    call_id = value.get("id")
    return ToolCall(name, _arguments_text(function.get("arguments", function.get("parameters"))),
                    call_id if isinstance(call_id, str) else None)


def parse_calls(value: Any) -> list[ToolCall]:
    """A `function_call` turn's content (JSON text of one call or a list of parallel calls) or an OpenAI
    `tool_calls` list -> calls. Raises ToolError naming what is wrong; the caller adds the file, row and field."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ToolError(f"is not valid JSON ({e.msg} at character {e.pos})") from None
    calls = value if isinstance(value, list) else [value]
    if not calls:
        raise ToolError("holds no call")
    parsed = []
    for i, call in enumerate(calls):
        try:
            parsed.append(parse_call(call))
        except ToolError as e:
            raise ToolError(f"[{i}]: {e}" if len(calls) > 1 else str(e)) from None
    return parsed


# -- each family's text ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CallLayout:
    """How an answer's calls are laid out, for constrained decoding: `prefix`, then each call as `call` with
    `{name}` and `{arguments}` (a JSON object) filled in, joined by `separator`, then `suffix`. A format whose
    single call is written differently from a list of them (llama3) gives `single` for the one-call case."""

    call: str
    separator: str = "\n"
    prefix: str = ""
    suffix: str = ""
    single: str | None = None
    parallel: bool = True


class ToolFormat:
    """One family's tool text. Subclasses define the three texts and the parser; `extract` is total."""

    name: str = ""
    layout: CallLayout

    def tools_text(self, tools: list[dict[str, Any]]) -> str:
        """The text added after the system prompt (LLaMA-Factory: `system + tools_text`)."""
        raise NotImplementedError

    def calls_text(self, calls: list[ToolCall]) -> str:
        """An answer's calls as the model writes them."""
        if len(calls) > 1 and not self.layout.parallel:
            raise ToolError(f"the {self.name} tool format has no parallel calls ({len(calls)} calls in one answer)")
        layout = self.layout
        if len(calls) == 1 and layout.single is not None:
            return _fill_call(layout.single, calls[0])
        return layout.prefix + layout.separator.join(_fill_call(layout.call, c) for c in calls) + layout.suffix

    def answer_text(self, content: str, calls: list[ToolCall]) -> str:
        """An assistant turn that may say something and then call: the text, a newline, the calls."""
        if not calls:
            return content
        text = self.calls_text(calls)
        return f"{content.rstrip()}\n{text}" if content.strip() else text

    def extract(self, text: str) -> tuple[str, list[ToolCall]]:
        """Generated text -> (the text before the calls, the calls). No valid call: (text, [])."""
        raise NotImplementedError

    markers: tuple[str, ...] = ()
    """Text that begins the calls in formats where calls may follow other text."""

    def hold_from(self, text: str) -> int:
        """While streaming an answer: where text that is, or may still become, a call begins (len(text): nowhere).
        A server sends text before that point as content and holds the rest until the answer ends, so a client never
        sees a raw call as content."""
        held = len(text)
        for marker in self.markers:
            found = text.find(marker)
            if found >= 0:
                held = min(held, found)
                continue
            for size in range(min(len(marker) - 1, len(text)), 0, -1):  # the end of text may be a marker's start
                if marker.startswith(text[-size:]):
                    held = min(held, len(text) - size)
                    break
        return held


def _fill_call(pattern: str, call: ToolCall) -> str:
    return pattern.replace("{name}", call.name).replace("{arguments}", call.arguments)


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None


def _json_calls(value: Any, arguments_key: str) -> list[ToolCall] | None:
    """Objects `{"name": ..., arguments_key: {...}}` (one or a list) -> calls; None if any is not one."""
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        if not (isinstance(item, dict) and isinstance(item.get("name"), str) and item["name"].strip()
                and isinstance(item.get(arguments_key, {}), dict)):
            return None
        calls.append(ToolCall(item["name"], canonical_json(item.get(arguments_key, {})), new_call_id()))
    return calls or None


class DefaultToolFormat(ToolFormat):
    """LLaMA-Factory's `default`: a ReAct-style description and `Action:` / `Action Input:` lines."""

    name = "default"
    layout = CallLayout(call="Action: {name}\nAction Input: {arguments}")
    markers = ("Action:",)

    def tools_text(self, tools: list[dict[str, Any]]) -> str:
        described = ""
        for tool in tools:
            function = tool["function"]
            parameters = function.get("parameters") or {}
            args = ""
            for name, param in (parameters.get("properties") or {}).items():
                required = ", required" if name in parameters.get("required", []) else ""
                enum = f", should be one of [{', '.join(str(v) for v in param['enum'])}]" if param.get("enum") else ""
                items = f", where each item should be {param['items'].get('type', '')}" if param.get("items") else ""
                args += f"  - {name} ({param.get('type', '')}{required}): {param.get('description', '')}{enum}{items}\n"
            described += (f"> Tool Name: {function['name']}\nTool Description: {function.get('description', '')}\n"
                          f"Tool Args:\n{args}\n")
        return ("You have access to the following tools:\n" + described + "Use the following format if using a tool:\n"
                "```\nAction: tool name (one of [" + ", ".join(tool_names(tools)) + "])\n"
                "Action Input: the input to the tool, in a JSON format representing the kwargs "
                '(e.g. ```{"input": "hello world", "num_beams": 5}```)\n```\n')

    _ACTION = re.compile(r"Action:\s*([a-zA-Z0-9_.-]+)\s*Action Input:\s*(.+?)(?=\s*Action:|\s*$)", re.DOTALL)

    def extract(self, text: str) -> tuple[str, list[ToolCall]]:
        first = re.search(r"Action:", text)
        if first is None:
            return text, []
        calls = []
        for match in self._ACTION.finditer(text, first.start()):
            arguments = _json_value(match.group(2).strip().strip('"').strip("`"))
            if not isinstance(arguments, dict):
                return text, []
            calls.append(ToolCall(match.group(1).strip(), canonical_json(arguments), new_call_id()))
        return (text[:first.start()].rstrip(), calls) if calls else (text, [])



class QwenToolFormat(ToolFormat):
    """Qwen 2.5 / Hermes: the functions as JSON lines in `<tools>`, each call a JSON object in `<tool_call>` tags."""

    name = "qwen"
    layout = CallLayout(call='<tool_call>\n{"name": "{name}", "arguments": {arguments}}\n</tool_call>')
    markers = ("<tool_call>",)

    def tools_text(self, tools: list[dict[str, Any]]) -> str:
        listed = "".join("\n" + canonical_json(tool) for tool in tools)
        return ("\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                "You are provided with function signatures within <tools></tools> XML tags:\n<tools>" + listed +
                "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
                '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, '
                '"arguments": <args-json-object>}\n</tool_call>')

    _CALL = re.compile(r"<tool_call>(.+?)</tool_call>", re.DOTALL)

    def extract(self, text: str) -> tuple[str, list[ToolCall]]:
        start = text.find("<tool_call>")
        if start < 0:
            return text, []
        calls: list[ToolCall] = []
        for match in self._CALL.finditer(text, start):
            found = _json_calls(_json_value(match.group(1).strip()), "arguments")
            if found is None or len(found) != 1:
                return text, []
            calls += found
        if not calls or text[start:].replace(" ", "").replace("\n", "") != "".join(
                m.group(0) for m in self._CALL.finditer(text, start)).replace(" ", "").replace("\n", ""):
            return text, []  # something other than calls after the first one: not a call answer
        return text[:start].rstrip(), calls



class Llama3ToolFormat(ToolFormat):
    """Llama 3.x JSON tool calling: the functions as indented JSON in the system turn, a call as
    `{"name": ..., "parameters": {...}}` (a list of them for parallel calls)."""

    name = "llama3"
    layout = CallLayout(call='{"name": "{name}", "parameters": {arguments}}', separator=", ", prefix="[", suffix="]",
                        single='{"name": "{name}", "parameters": {arguments}}')

    def tools_text(self, tools: list[dict[str, Any]]) -> str:
        listed = "".join(json.dumps(tool, indent=4, ensure_ascii=False) + "\n\n" for tool in tools)
        return (f"Cutting Knowledge Date: December 2023\nToday Date: {LLAMA3_DATE}\n\n"
                "You have access to the following functions. To call a function, please respond with JSON for a "
                'function call. Respond in the format {"name": function name, "parameters": dictionary of argument '
                'name and its value}. Do not use variables.\n\n' + listed)

    def extract(self, text: str) -> tuple[str, list[ToolCall]]:
        calls = _json_calls(_json_value(text.strip()), "parameters")
        return ("", calls) if calls else (text, [])

    def hold_from(self, text: str) -> int:
        # A call is the whole answer: hold an answer that starts (or may start) with JSON.
        head = text.lstrip()
        return 0 if not head or head[0] in "{[" else len(text)


class MistralToolFormat(ToolFormat):
    """Mistral v0.3: `[AVAILABLE_TOOLS] [...][/AVAILABLE_TOOLS]` and `[TOOL_CALLS] [{"name", "arguments"}, ...]`."""

    name = "mistral"
    layout = CallLayout(call='{"name": "{name}", "arguments": {arguments}}', separator=", ",
                        prefix="[TOOL_CALLS] [", suffix="]")
    markers = ("[TOOL_CALLS]",)

    def tools_text(self, tools: list[dict[str, Any]]) -> str:
        return "[AVAILABLE_TOOLS] " + canonical_json(tools) + "[/AVAILABLE_TOOLS]"

    def extract(self, text: str) -> tuple[str, list[ToolCall]]:
        start = text.find("[TOOL_CALLS]")
        if start < 0:
            return text, []
        calls = _json_calls(_json_value(text[start + len("[TOOL_CALLS]"):].strip()), "arguments")
        return (text[:start].rstrip(), calls) if calls else (text, [])



class GLM4ToolFormat(ToolFormat):
    """GLM-4: each function as indented JSON under a `## name` heading; a call is the name, a newline, the
    arguments. One call per answer."""

    name = "glm4"
    layout = CallLayout(call="{name}\n{arguments}", parallel=False)

    def tools_text(self, tools: list[dict[str, Any]]) -> str:
        listed = "".join(f"\n\n## {tool['function']['name']}\n\n"
                         f"{json.dumps(tool['function'], indent=4, ensure_ascii=False)}\n"
                         "在调用上述函数时，请使用 Json 格式表示调用的参数。" for tool in tools)
        return ("你是一个名为 ChatGLM 的人工智能助手。你是基于智谱 AI 公司训练的语言模型 GLM-4 模型开发的，"
                "你的任务是针对用户的问题和要求提供适当的答复和支持。\n\n# 可用工具" + listed)

    def extract(self, text: str) -> tuple[str, list[ToolCall]]:
        name, newline, rest = text.strip().partition("\n")
        arguments = _json_value(rest.strip()) if newline else None
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or not isinstance(arguments, dict):
            return text, []
        return "", [ToolCall(name, canonical_json(arguments), new_call_id())]

    def hold_from(self, text: str) -> int:
        # A call is the whole answer, a bare name first: hold while the first line may still be a function's name.
        first_line = text.lstrip().split("\n", 1)[0]
        return 0 if re.fullmatch(r"[A-Za-z0-9_.-]*", first_line) else len(text)


TOOL_FORMATS: dict[str, ToolFormat] = {f.name: f for f in (DefaultToolFormat(), QwenToolFormat(), Llama3ToolFormat(),
                                                           MistralToolFormat(), GLM4ToolFormat())}
TOOL_FORMAT_ALIASES = {"hermes": "qwen", "chatml": "qwen"}


def get_tool_format(name: str) -> ToolFormat:
    """A tool format by name (`hermes` is Qwen's); ToolError with the known names otherwise."""
    key = TOOL_FORMAT_ALIASES.get(name, name)
    if key not in TOOL_FORMATS:
        known = ", ".join(sorted([*TOOL_FORMATS, *TOOL_FORMAT_ALIASES]))
        raise ToolError(f"unknown tool format {name!r}; known: {known}")
    return TOOL_FORMATS[key]
