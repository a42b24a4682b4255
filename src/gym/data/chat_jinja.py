"""A named template as a Jinja chat template, for exports: transformers, vLLM and llama.cpp read it and render what
Gym trained, tools included (`tools=` after the system prompt, assistant `tool_calls`, `tool` messages), and for a
vision-language model the images in OpenAI-style content parts."""

from __future__ import annotations

import json

from gym.data.media import PLACEHOLDERS
from gym.data.templates import EMPTY_THOUGHT, Template, _fill
from gym.data.tools import ToolFormat, canonical_json, get_tool_format


def _jinja_text(text: str) -> str:
    """`text` as a Jinja string literal expression."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


def _jinja_turn(fmt: str, eos: str, content: str) -> str:
    """A turn format as a Jinja expression around the variable `content`."""
    before, _, after = _fill(fmt, "\0", eos).partition("\0")
    return f"{_jinja_text(before)} ~ {content} ~ {_jinja_text(after)}"


# A tool whose text cannot occur elsewhere: rendering it with a format's Python code and cutting around it gives the
# format's fixed text, so the Jinja below cannot drift from gym.data.tools.
_SENTINEL_NAME, _SENTINEL_DESCRIPTION = "\x01name\x01", "\x01description\x01"
_SENTINEL_TOOL = {"type": "function", "function": {"name": _SENTINEL_NAME, "description": _SENTINEL_DESCRIPTION,
                                                   "parameters": {"type": "object", "properties": {}}}}

_JINJA_FUNCTION = "{%- set f = tool.function if tool.function is defined else tool -%}"


def _jinja_tools_text(fmt: ToolFormat) -> str:
    """Jinja statements that set `ns.tools` to `fmt.tools_text(tools)` (when `tools` is given and not empty)."""
    text = fmt.tools_text([_SENTINEL_TOOL])
    if fmt.name in ("qwen", "llama3", "mistral"):
        item, expression, per_tool = {
            "qwen": ("\n" + canonical_json(_SENTINEL_TOOL), "'\\n' ~ (tool | tojson)", True),
            "llama3": (json.dumps(_SENTINEL_TOOL, indent=4, ensure_ascii=False) + "\n\n",
                       "(tool | tojson(indent=4)) ~ '\\n\\n'", True),
            "mistral": (canonical_json([_SENTINEL_TOOL]), "(tools | tojson)", False),
        }[fmt.name]
        head, tail = text.split(item)
        body = (f"{{%- for tool in tools -%}}{{%- set ns.tools = ns.tools ~ {expression} -%}}{{%- endfor -%}}"
                if per_tool else f"{{%- set ns.tools = ns.tools ~ {expression} -%}}")
        return (f"{{%- set ns.tools = {_jinja_text(head)} -%}}{body}"
                f"{{%- set ns.tools = ns.tools ~ {_jinja_text(tail)} -%}}")
    if fmt.name == "glm4":
        head = fmt.tools_text([])
        dumped = json.dumps(_SENTINEL_TOOL["function"], indent=4, ensure_ascii=False)
        before, after = text[len(head):].split(dumped)
        heading, below = before.split(_SENTINEL_NAME)
        return (f"{{%- set ns.tools = {_jinja_text(head)} -%}}{{%- for tool in tools -%}}{_JINJA_FUNCTION}"
                f"{{%- set ns.tools = ns.tools ~ {_jinja_text(heading)} ~ f.name ~ {_jinja_text(below)} ~ "
                f"(f | tojson(indent=4)) ~ {_jinja_text(after)} -%}}{{%- endfor -%}}")
    if fmt.name == "default":
        head, rest = text.split("> Tool Name: " + _SENTINEL_NAME)
        usage_before, usage_after = rest[rest.index("Use the following"):].split(_SENTINEL_NAME)
        return (
            f"{{%- set ns.tools = {_jinja_text(head)} -%}}{{%- set ns.names = [] -%}}"
            f"{{%- for tool in tools -%}}{_JINJA_FUNCTION}{{%- set ns.names = ns.names + [f.name] -%}}"
            "{%- set p = f.get('parameters') or {} -%}{%- set ns.args = '' -%}"
            "{%- for name, param in (p.get('properties') or {}).items() -%}"
            "{%- set required = ', required' if name in p.get('required', []) else '' -%}"
            "{%- set enum = ', should be one of [' ~ (param.get('enum') | map('string') | join(', ')) ~ ']' "
            "if param.get('enum') else '' -%}"
            "{%- set items = ', where each item should be ' ~ param.get('items').get('type', '') "
            "if param.get('items') else '' -%}"
            "{%- set ns.args = ns.args ~ '  - ' ~ name ~ ' (' ~ param.get('type', '') ~ required ~ '): ' ~ "
            "param.get('description', '') ~ enum ~ items ~ '\\n' -%}{%- endfor -%}"
            "{%- set ns.tools = ns.tools ~ '> Tool Name: ' ~ f.name ~ '\\nTool Description: ' ~ "
            "f.get('description', '') ~ '\\nTool Args:\\n' ~ ns.args ~ '\\n' -%}{%- endfor -%}"
            f"{{%- set ns.tools = ns.tools ~ {_jinja_text(usage_before)} ~ (ns.names | join(', ')) ~ "
            f"{_jinja_text(usage_after)} -%}}")
    raise ValueError(f"no Jinja for the {fmt.name} tool format")


def _jinja_calls(fmt: ToolFormat) -> str:
    """Jinja statements that set `ns.calls` to `fmt.calls_text` of `message.tool_calls` (OpenAI or transformers
    shape: arguments as a JSON string or a mapping)."""
    def pieces(pattern: str) -> tuple[str, str, str]:
        before, rest = pattern.split("{name}")
        middle, after = rest.split("{arguments}")
        return before, middle, after

    layout = fmt.layout
    before, middle, after = pieces(layout.call)
    statements = [
        "{%- set ns.calls = '' -%}{%- set ns.single = '' -%}{%- for call in message['tool_calls'] -%}"
        "{%- set f = call.function if call.function is defined else call -%}"
        "{%- set arguments = f.arguments if f.arguments is string else (f.arguments | tojson) -%}"
        f"{{%- set ns.calls = ns.calls ~ ('' if loop.first else {_jinja_text(layout.separator)}) ~ "
        f"{_jinja_text(before)} ~ f.name ~ {_jinja_text(middle)} ~ arguments ~ {_jinja_text(after)} -%}}"]
    if layout.single is not None:
        s_before, s_middle, s_after = pieces(layout.single)
        statements.append(f"{{%- if loop.first -%}}{{%- set ns.single = {_jinja_text(s_before)} ~ f.name ~ "
                          f"{_jinja_text(s_middle)} ~ arguments ~ {_jinja_text(s_after)} -%}}{{%- endif -%}}")
    statements.append("{%- endfor -%}")
    if not layout.parallel:
        statements.append("{%- if message['tool_calls'] | length > 1 -%}{{- raise_exception("
                          f"{_jinja_text(f'the {fmt.name} tool format has no parallel calls')}) -}}}}{{%- endif -%}}")
    wrapped = f"{_jinja_text(layout.prefix)} ~ ns.calls ~ {_jinja_text(layout.suffix)}"
    if layout.single is not None:
        statements.append("{%- if message['tool_calls'] | length == 1 -%}{%- set ns.calls = ns.single -%}"
                          f"{{%- else -%}}{{%- set ns.calls = {wrapped} -%}}{{%- endif -%}}")
    else:
        statements.append(f"{{%- set ns.calls = {wrapped} -%}}")
    return "".join(statements)


def jinja_chat_template(template: Template, eos: str, default_system: str | None = None,
                        enable_thinking: bool = True, tool_format: ToolFormat | str | None = None) -> str:
    """A Jinja chat template that renders what ChatFormat renders with `template`: the same text for a conversation
    ending with an assistant turn, and the same prompt with `add_generation_prompt` after a user turn. Since Gym's
    user turn ends with the assistant header, a conversation ending with a user turn gets the header either way.

    Tools too, so that vLLM, transformers and llama.cpp serve what was trained: `tools=` after the system prompt,
    assistant `tool_calls` and `tool` messages (consecutive ones as one observation turn), in `tool_format` (the
    template's family when None)."""
    t = template
    fmt = get_tool_format(tool_format) if isinstance(tool_format, str) else tool_format
    fmt = fmt or (get_tool_format(t.tool_format) if t.tool_format else None)
    system = default_system or t.default_system
    user = _jinja_turn(t.user, eos, "content")
    obs_before, _, obs_after = _fill(t.observation or t.user, "\0", eos).partition("\0")
    empty_thought = _jinja_text(EMPTY_THOUGHT)
    parts = [
        "{%- set thinking = enable_thinking if enable_thinking is defined else "
        f"{'true' if enable_thinking else 'false'} -%}}",
        "{%- set ns = namespace(tools='', calls='', single='', names=[], args='') -%}",
        "{%- if messages and messages[0]['role'] == 'system' -%}"
        "{%- set system = messages[0]['content'] -%}{%- set turns = messages[1:] -%}"
        f"{{%- else -%}}{{%- set system = {_jinja_text(system) if system else 'none'} -%}}"
        "{%- set turns = messages -%}{%- endif -%}",
    ]
    if fmt is not None:
        parts.append(f"{{%- if tools is defined and tools -%}}{_jinja_tools_text(fmt)}{{%- endif -%}}")
    parts += ["{%- set system_text = (system or '') ~ ns.tools -%}", f"{{{{- {_jinja_text(t.prefix)} -}}}}"]
    if t.system:
        parts.append(f"{{%- if system_text -%}}{{{{- {_jinja_turn(t.system, eos, 'system_text')} -}}}}"
                     "{%- endif -%}")
    parts.append("{%- for message in turns -%}{%- set content = message['content'] or '' -%}"
                 "{%- set result_roles = ['tool', 'observation'] -%}"
                 "{%- set is_result = message['role'] in result_roles -%}"
                 "{%- set after_result = not loop.first and turns[loop.index0 - 1]['role'] in result_roles -%}"
                 "{%- set before_result = not loop.last and turns[loop.index0 + 1]['role'] in result_roles -%}")
    if not t.system:
        parts.append("{%- if loop.first and system_text -%}"
                     f"{{%- set content = {_jinja_turn(t.system_in_user, eos, 'system_text')} ~ content -%}}"
                     "{%- endif -%}")
    # Parallel results: one observation slot around all of them, the separator between them.
    parts.append("{%- if message['role'] != 'assistant' -%}{%- if is_result -%}"
                 f"{{%- if not after_result -%}}{{{{- {_jinja_text(obs_before)} -}}}}{{%- endif -%}}{{{{- content -}}}}"
                 f"{{%- if before_result -%}}{{{{- {_jinja_text(t.observation_separator)} -}}}}"
                 f"{{%- else -%}}{{{{- {_jinja_text(obs_after)} -}}}}{{%- endif -%}}"
                 f"{{%- else -%}}{{{{- {user} -}}}}{{%- endif -%}}")
    if t.thinking:
        # Thinking off: every answer without a thought gets the empty one in its prompt, as in _render_named.
        parts.append("{%- if not thinking and not before_result and (loop.last or "
                     "'<think>' not in (turns[loop.index0 + 1]['content'] or '')) -%}"
                     f"{{{{- {empty_thought} -}}}}{{%- endif -%}}")
    parts.append("{%- else -%}{%- set has_thought = '<think>' in content -%}")
    function_slot = t.function if t.function is not None else t.assistant
    if fmt is not None:
        parts.append(f"{{%- if message['tool_calls'] is defined and message['tool_calls'] -%}}{_jinja_calls(fmt)}"
                     "{%- if content | trim -%}{%- set content = content.rstrip() ~ '\\n' ~ ns.calls -%}"
                     "{%- else -%}{%- set content = ns.calls -%}{%- endif -%}{%- endif -%}")
    if t.thinking:
        parts.append("{%- if not has_thought and thinking -%}"
                     f"{{%- set content = {empty_thought} ~ content -%}}{{%- endif -%}}")
    parts.append("{%- if message['tool_calls'] is defined and message['tool_calls'] -%}"
                 f"{{{{- {_jinja_turn(function_slot, eos, 'content')} -}}}}"
                 f"{{%- else -%}}{{{{- {_jinja_turn(t.assistant, eos, 'content')} -}}}}{{%- endif -%}}"
                 "{%- endif -%}{%- endfor -%}")
    return "".join(parts)


def content_parts_template(template: str, placeholders: dict[str, str]) -> str:
    """`template` preceded by Jinja that turns each message's OpenAI-style content parts into text first: text parts
    as they are, an image (video, audio) part as `placeholders[kind]`, the text the model's processor expands. A
    `<image>` written in plain text (Gym's row convention) becomes the placeholder too. Gym's templates read each
    content as a string; processors' apply_chat_template hand them lists of parts."""
    kinds = {"image": "images", "image_url": "images", "video": "videos", "video_url": "videos",
             "audio": "audios", "input_audio": "audios", "audio_url": "audios"}
    part_text = "".join(f"{{%- elif part['type'] == {kind!r} -%}}{{%- set text.value = text.value ~ "
                        f"{placeholders[media]!r} -%}}" for kind, media in kinds.items() if media in placeholders)
    replaces = "".join(f" | replace({PLACEHOLDERS[media]!r}, {text!r})" for media, text in placeholders.items()
                       if text != PLACEHOLDERS[media])
    return ("{%- set parts_ns = namespace(messages=[]) -%}"
            "{%- for message in messages -%}"
            "{%- set text = namespace(value='') -%}"
            "{%- if message['content'] is string -%}{%- set text.value = message['content'] -%}"
            "{%- elif message['content'] is none or message['content'] is not defined -%}{%- set text.value = none -%}"
            "{%- else -%}{%- for part in message['content'] -%}"
            "{%- if part['type'] == 'text' -%}{%- set text.value = text.value ~ part['text'] -%}"
            f"{part_text}{{%- endif -%}}{{%- endfor -%}}{{%- endif -%}}"
            f"{{%- if text.value is string -%}}{{%- set text.value = text.value{replaces} -%}}{{%- endif -%}}"
            "{%- set parts_ns.messages = parts_ns.messages + [{'role': message['role'], 'content': text.value, "
            "'tool_calls': message['tool_calls'] if message['tool_calls'] is defined else none}] -%}"
            "{%- endfor -%}"
            "{%- set messages = parts_ns.messages -%}" + template)
