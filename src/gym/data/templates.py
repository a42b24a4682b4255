"""Chat templates: how a conversation becomes text, split into (prompt, response) pieces.

By default Gym uses the tokenizer's own chat template, so a model is trained in exactly the format
it is served in. Named templates are small declarative definitions for tokenizers that have none,
or for choosing a format on purpose; Gym warns when a named template disagrees with the
tokenizer's own. Every response piece ends with the model's end-of-turn token, so trained models stop.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, cast

import yaml

from gym.core.errors import ConfigError, DataError, GymError
from gym.core.files import CONFIG_FILE
from gym.data.messages import FUNCTION, OBSERVATION, tool_calls, tool_results
from gym.data.tools import (
    TOOL_FORMAT_ALIASES,
    TOOL_FORMATS,
    ToolCall,
    ToolError,
    ToolFormat,
    get_tool_format,
)

logger = logging.getLogger(__name__)

EMPTY_THOUGHT = "<think>\n\n</think>\n\n"


@dataclass(frozen=True)
class Template:
    """A chat format. `{content}` marks where text goes; `{eos}` is the tokenizer's EOS token.

    `user` ends with the assistant header, so a rendered prompt is ready for the answer.
    `system` empty means the format has no system turn: the system text, written as `system_in_user`, opens the
    first user message instead (LLaMA-Factory's Llama2Template: Llama 2's `<<SYS>>` block, Gemma's blank line).

    Tools, as LLaMA-Factory's templates define them per family: `tool_format` names the family's text for the
    offered tools (added after the system prompt) and for calls (gym.data.tools); `function` is the slot of an
    answer that calls (the assistant slot when None); `observation` wraps a turn of tool results, and
    `observation_separator` goes between parallel results inside it, so that several results come out as the
    family's own template writes several `tool` messages.
    """

    name: str
    user: str
    assistant: str
    system: str = ""
    prefix: str = ""
    observation: str | None = None
    default_system: str | None = None
    thinking: bool = False
    function: str | None = None
    observation_separator: str = "\n"
    tool_format: str | None = None
    system_in_user: str = "{content}\n\n"


class _TemplateTurns(TypedDict):
    system: str
    user: str
    assistant: str
    observation: str
    observation_separator: str
    tool_format: str


# Qwen 2.5's own template writes tool results as a user turn of <tool_response> blocks (LLaMA-Factory's qwen too).
_CHATML = _TemplateTurns(
    system="<|im_start|>system\n{content}<|im_end|>\n",
    user="<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n",
    assistant="{content}<|im_end|>\n",
    observation="<|im_start|>user\n<tool_response>\n{content}\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
    observation_separator="\n</tool_response>\n<tool_response>\n",
    tool_format="qwen",
)

TEMPLATES: dict[str, Template] = {
    t.name: t
    for t in [
        Template("chatml", **_CHATML),
        Template("qwen", **_CHATML,
                 default_system="You are Qwen, created by Alibaba Cloud. You are a helpful assistant."),
        Template("qwen3", **_CHATML, thinking=True),
        Template("qwen3_nothink", **_CHATML),  # LLaMA-Factory's name for Qwen3 with thinking off
        # The vision-language Qwens write turns as their text models do; the image placeholders in the text are
        # the processor's to expand (gym.models.vision), not the template's.
        Template("qwen2_vl", **_CHATML, default_system="You are a helpful assistant."),
        Template("qwen3_vl", **_CHATML, thinking=True),
        Template("qwen3_vl_nothink", **_CHATML),
        Template("moss_vl", **_CHATML),
        Template(
            "llama3",
            prefix="<|begin_of_text|>",
            system="<|start_header_id|>system<|end_header_id|>\n\n{content}<|eot_id|>",
            user="<|start_header_id|>user<|end_header_id|>\n\n{content}<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
            assistant="{content}<|eot_id|>",
            observation="<|start_header_id|>ipython<|end_header_id|>\n\n{content}<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
            # Llama 3.1 writes each result as its own ipython turn
            observation_separator="<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n",
            tool_format="llama3",
        ),
        Template("mistral", prefix="<s>", user="[INST] {content}[/INST]", assistant="{content}</s>",
                 observation='[TOOL_RESULTS] {"content": {content}}[/TOOL_RESULTS]',
                 observation_separator='}[/TOOL_RESULTS][TOOL_RESULTS] {"content": ', tool_format="mistral"),
        Template(
            "gemma",
            prefix="<bos>",
            user="<start_of_turn>user\n{content}<end_of_turn>\n<start_of_turn>model\n",
            assistant="{content}<end_of_turn>\n",
        ),
        # GLM-4 has no end-of-answer text: the model stops by writing <|user|> or <|observation|>, and the
        # supervised processor appends EOS to each answer (LLaMA-Factory's efficient_eos).
        Template("glm4", prefix="[gMASK]<sop>", system="<|system|>\n{content}", user="<|user|>\n{content}<|assistant|>",
                 assistant="\n{content}", function="{content}",
                 observation="<|observation|>\n{content}<|assistant|>", observation_separator="<|observation|>\n",
                 tool_format="glm4"),
        Template("default", system="System: {content}\n", user="Human: {content}\nAssistant: ",
                 assistant="{content}{eos}\n", tool_format="default"),
        Template(
            "alpaca",
            user="### Instruction:\n{content}\n\n### Response:\n",
            assistant="{content}{eos}\n\n",
            system="{content}\n\n",
            default_system="Below is an instruction that describes a task. "
            "Write a response that appropriately completes the request.",
        ),
        # The templates below write what LLaMA-Factory's template of the same name writes, character for character,
        # so configs brought from it train on the same text. Where that differs from the model's own chat template,
        # the comment says how; `template:` unset keeps the tokenizer's own.
        # Llama 2 puts the system prompt in the first [INST], and a BOS before every [INST]. The model's own
        # template also puts a space on either side of each answer ("[/INST] 4. </s>").
        Template("llama2", user="<s>[INST] {content} [/INST]", assistant="{content}{eos}",
                 system_in_user="<<SYS>>\n{content}\n<</SYS>>\n\n"),
        Template(
            "llama4",
            prefix="<|begin_of_text|>",
            system="<|header_start|>system<|header_end|>\n\n{content}<|eot|>",
            user="<|header_start|>user<|header_end|>\n\n{content}<|eot|><|header_start|>assistant<|header_end|>\n\n",
            assistant="{content}<|eot|>",
            observation="<|header_start|>ipython<|header_end|>\n\n{content}<|eot|>"
            "<|header_start|>assistant<|header_end|>\n\n",
            observation_separator="<|eot|><|header_start|>ipython<|header_end|>\n\n",
            tool_format="llama3",
        ),
        # Gemma 3 writes text turns as Gemma does (the system text opens the first user turn); its images are the
        # processor's to expand.
        Template("gemma3", prefix="<bos>", user="<start_of_turn>user\n{content}<end_of_turn>\n<start_of_turn>model\n",
                 assistant="{content}<end_of_turn>\n"),
        # Vicuna v1.1 as FastChat writes it has spaces ("... questions. USER: Hi ASSISTANT: 4.</s>"); LLaMA-Factory
        # writes none.
        Template("vicuna", system="{content}", user="USER: {content} ASSISTANT:", assistant="{content}{eos}",
                 default_system="A chat between a curious user and an artificial intelligence assistant. "
                 "The assistant gives helpful, detailed, and polite answers to the user's questions."),
        # Zephyr's own template ends each turn with "</s>\n"; LLaMA-Factory's with "</s>".
        Template("zephyr", system="<|system|>\n{content}{eos}", user="<|user|>\n{content}{eos}<|assistant|>\n",
                 assistant="{content}{eos}", default_system="You are Zephyr, a helpful assistant."),
        # Phi-3, without the BOS some revisions of its template write (as LLaMA-Factory).
        Template("phi", system="<|system|>\n{content}<|end|>\n", user="<|user|>\n{content}<|end|>\n<|assistant|>\n",
                 assistant="{content}<|end|>\n"),
        Template("phi4", system="<|im_start|>system<|im_sep|>{content}<|im_end|>",
                 user="<|im_start|>user<|im_sep|>{content}<|im_end|><|im_start|>assistant<|im_sep|>",
                 assistant="{content}<|im_end|>"),
        # DeepSeek LLM (V1, V2). Its own template writes "Assistant: " before a past answer and "Assistant:" before
        # the next one; LLaMA-Factory "Assistant:" before both.
        Template("deepseek", prefix="<｜begin▁of▁sentence｜>", system="{content}\n\n",
                 user="User: {content}\n\nAssistant:", assistant="{content}{eos}"),
        # DeepSeek V3: the system text right after the BOS, with nothing between it and the first user turn.
        Template("deepseek3", prefix="<｜begin▁of▁sentence｜>", system="{content}",
                 user="<｜User｜>{content}<｜Assistant｜>", assistant="{content}{eos}"),
        # Yi writes ChatML; tool results are a plain user turn (Qwen's <tool_response> blocks are Qwen's).
        Template("yi", system=_CHATML["system"], user=_CHATML["user"], assistant=_CHATML["assistant"]),
        # Command R: the answer ends with EOS, which is <|END_OF_TURN_TOKEN|> in its tokenizer.
        Template(
            "cohere",
            prefix="<BOS_TOKEN>",
            system="<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>{content}<|END_OF_TURN_TOKEN|>",
            user="<|START_OF_TURN_TOKEN|><|USER_TOKEN|>{content}<|END_OF_TURN_TOKEN|>"
            "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
            assistant="{content}{eos}",
        ),
    ]
}

TOOL_TEMPLATES = sorted(name for name, t in TEMPLATES.items() if t.tool_format)


def _fill(fmt: str, content: str, eos: str) -> str:
    # str.replace, not str.format: user text may contain braces.
    return fmt.replace("{eos}", eos).replace("{content}", content)


def _answer_text(fmt: ToolFormat, content: str, calls: list[ToolCall]) -> str:
    try:
        return fmt.answer_text(content, calls)
    except ToolError as e:  # parallel calls in a format that has none: the data asks for what the format cannot say
        raise DataError(f"{str(e)[0].upper()}{str(e)[1:]}: split them into one call per answer, or use a tool "
                        "format with parallel calls.") from None


def resolve_tool_format(name: str | None) -> ToolFormat | None:
    """The `tool_format:` key -> its ToolFormat; ConfigError naming the closest known name otherwise."""
    if name is None:
        return None
    try:
        return get_tool_format(name)
    except ToolError:
        known = sorted([*TOOL_FORMATS, *TOOL_FORMAT_ALIASES])
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"Unknown tool_format '{name}'.{hint} Known: {', '.join(known)}.") from None


@dataclass(frozen=True)
class ToolSupport:
    """What a tokenizer's own chat template does with tools, found by rendering a probe conversation."""

    renders_tools: bool
    renders_calls: bool
    renders_results: bool
    family: ToolFormat | None
    """The family whose call text the template writes (None: none of LLaMA-Factory's five)."""

    @property
    def native(self) -> bool:
        return self.renders_tools and self.renders_calls and self.renders_results

    def missing(self) -> str:
        gaps = [what for ok, what in ((self.renders_tools, "the `tools` list (rendering with and without them gives "
                                       "the same text)"), (self.renders_calls, "assistant `tool_calls`"),
                                      (self.renders_results, "`tool` messages")) if not ok]
        return " and ".join(gaps)


_PROBE_CALL = ToolCall("gym_probe_function", '{"probe_argument": 7}', "gymprobe1")
_PROBE_TOOLS = [{"type": "function", "function": {
    "name": "gym_probe_function", "description": "A probe.",
    "parameters": {"type": "object", "properties": {"probe_argument": {"type": "integer"}}}}}]


class ChatFormat:
    """Renders conversations for one tokenizer, with either a named template or the tokenizer's own.

    Messages are in gym.data.messages' shape (assistant turns may hold `tool_calls`, tool results are observation
    turns); `tools` is an OpenAI-shaped list of functions (gym.data.tools.parse_tools)."""

    def __init__(self, tokenizer: Any, template: Template | None, default_system: str | None = None,
                 enable_thinking: bool = True, tool_format: str | None = None) -> None:
        if template is None and not getattr(tokenizer, "chat_template", None):
            raise ConfigError("This tokenizer has no chat template of its own: set `template:` to one of "
                              f"{', '.join(sorted(TEMPLATES))}.")
        self.tokenizer = tokenizer
        self.template = template
        self.default_system = default_system
        self.enable_thinking = enable_thinking
        self.tool_format_override = resolve_tool_format(tool_format)
        self._support: ToolSupport | None = None

    @property
    def name(self) -> str:
        return self.template.name if self.template else "tokenizer"

    @property
    def tool_format(self) -> ToolFormat | None:
        """The family format used to render tools and calls and to read calls back from generated text; None when
        this format cannot do tools. Named templates: the `tool_format:` key, else the template's family. The
        tokenizer's template: the family its probe render shows, else the `tool_format:` key."""
        if self.template is not None:
            if self.tool_format_override is not None:
                return self.tool_format_override
            return get_tool_format(self.template.tool_format) if self.template.tool_format else None
        support = self.tool_support()
        if support.native:
            return support.family or self.tool_format_override
        return self.tool_format_override

    def tool_support(self) -> ToolSupport:
        """What the tokenizer's own template does with tools (probed once); named templates render them all."""
        if self.template is not None:
            fmt = self.tool_format
            return ToolSupport(fmt is not None, fmt is not None, True, fmt)
        if self._support is None:
            self._support = self._probe_tools()
        return self._support

    def require_tools(self, where: str = "This conversation") -> ToolFormat | None:
        """Fail (DataError, exit 2) when this format cannot render tools and calls, naming the fix; never drop them.
        Returns the family format the text is written in (None: the tokenizer's template writes it natively in a
        family Gym does not know, so calls are not read back)."""
        if self.template is not None:
            if self.tool_format is None:
                raise DataError(
                    f"{where} has tools or tool calls, and template '{self.template.name}' has no tool format, so "
                    "they cannot be rendered. Set `tool_format:` (" + ", ".join(sorted(TOOL_FORMATS)) + ") or "
                    f"`template:` to one with tools ({', '.join(TOOL_TEMPLATES)}).")
            return self.tool_format
        support = self.tool_support()
        if support.native or self.tool_format_override is not None:
            return self.tool_format
        raise DataError(
            f"{where} has tools or tool calls, and this tokenizer's chat template ignores {support.missing()}, so "
            "the model would never see them. Set `template:` to a named template with tools "
            f"({', '.join(TOOL_TEMPLATES)}), or set `tool_format:` (" + ", ".join(sorted(TOOL_FORMATS)) + ") to "
            "write the tools and calls as text inside this template's messages.")

    def render_pairs(self, messages: Sequence[Mapping[str, Any]], system: str | None = None,
                     tools: list[dict[str, Any]] | None = None) -> list[tuple[str, str]]:
        """A conversation ending with an assistant turn -> [(prompt text, response text)] per assistant turn.

        Concatenating every piece gives the whole conversation as the template renders it. Tool results are part
        of the prompt pieces; an answer's tool calls are part of its response piece (so they are learned)."""
        system = system or self.default_system
        if tools or any(tool_calls(m) for m in messages):
            self.require_tools()
        if self.template is None:
            return self._render_with_tokenizer(messages, system, tools or None)
        return self._render_named(messages, system, tools or None)

    def render_prompt(self, messages: Sequence[Mapping[str, Any]], system: str | None = None,
                      tools: list[dict[str, Any]] | None = None) -> str:
        """A conversation ending with a user or observation turn -> the text that asks the model for the next
        answer, with `tools` offered as in training."""
        system = system or self.default_system
        if tools or any(tool_calls(m) for m in messages):
            self.require_tools()
        if self.template is None:
            hf, _ = self._hf_messages(messages, system, tools or None)
            return self._apply(hf, add_generation_prompt=True, tools=self._hf_tools(tools or None))
        # The prompt of the turn to come is exactly its training prompt piece (which already holds the
        # empty thought when thinking is off), after the earlier turns as trained.
        *history, (last_prompt, _) = self._render_named([*messages, {"role": "assistant", "content": ""}], system,
                                                        tools or None)
        return "".join(p + r for p, r in history) + last_prompt

    def stop_token_ids(self) -> list[int]:
        """Token ids that end an assistant turn in this format (for generation)."""
        ids = set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        if self.template is not None:
            end = _fill(self.template.assistant, "", self.tokenizer.eos_token or "").strip()
            tokens = self.tokenizer.encode(end, add_special_tokens=False) if end else []
            if tokens and tokens[0] in self.tokenizer.all_special_ids:
                ids.add(tokens[0])
        return sorted(ids)

    # -- named templates ------------------------------------------------------------------------
    def _render_named(self, messages: Sequence[Mapping[str, Any]], system: str | None,
                      tools: list[dict[str, Any]] | None) -> list[tuple[str, str]]:
        t, eos = self.template, self.tokenizer.eos_token or ""
        assert t is not None, "only called for a named template"
        fmt = self.tool_format
        system = system or t.default_system
        # LLaMA-Factory: the tools text goes after the system prompt, in the system slot (or, for a format with no
        # system turn, before the first user message)
        system_text = (system or "") + (fmt.tools_text(tools) if tools and fmt else "")
        head = t.prefix + (_fill(t.system, system_text, eos) if system_text and t.system else "")
        pairs = []
        for i in range(0, len(messages) - 1, 2):
            query, answer = messages[i], messages[i + 1]
            if query["role"] == OBSERVATION:
                content = t.observation_separator.join(tool_results(query))
                slot = t.observation or t.user
            else:
                content, slot = query["content"], t.user
            if i == 0 and system_text and not t.system:
                content = _fill(t.system_in_user, system_text, eos) + content
            prompt = (head if i == 0 else "") + _fill(slot, content, eos)
            calls = tool_calls(answer)
            response = _answer_text(fmt, answer["content"], calls) if calls and fmt else answer["content"]
            if t.thinking and "<think>" not in answer["content"]:
                # Qwen3 renders an empty thought for non-thinking answers. With thinking off it is part
                # of the prompt (what inference sends); with thinking on the model learns to emit it.
                if self.enable_thinking:
                    response = EMPTY_THOUGHT + response
                else:
                    prompt += EMPTY_THOUGHT
            answer_slot = t.function if calls and t.function is not None else t.assistant
            pairs.append((prompt, _fill(answer_slot, response, eos)))
        return pairs

    # -- the tokenizer's own template -----------------------------------------------------------
    def _text_tools(self) -> ToolFormat | None:
        """The format to write tools and calls as text with, when the tokenizer's template cannot render them
        itself but `tool_format:` says how (None: the template renders them natively)."""
        if self.template is not None or self.tool_support().native:
            return None
        return self.tool_format_override

    def _hf_tools(self, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        return tools if tools and self._text_tools() is None else None

    def _hf_messages(self, messages: Sequence[Mapping[str, Any]], system: str | None,
                     tools: list[dict[str, Any]] | None) -> tuple[list[dict[str, Any]], list[int]]:
        """Internal messages -> the messages a transformers chat template reads, and after each internal message
        how many of those there are (an observation turn becomes one `tool` message per result)."""
        text_tools = self._text_tools() if (tools or any(tool_calls(m) for m in messages)) else None
        if text_tools is not None and tools:
            system = (system or "") + text_tools.tools_text(tools)
        out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        ends = []
        for m in messages:
            calls = tool_calls(m)
            if m["role"] == OBSERVATION:
                ids = m.get("tool_call_ids") or [None] * len(tool_results(m))
                out += [{"role": "tool", "content": r, **({"tool_call_id": c} if c else {})}
                        for r, c in zip(tool_results(m), ids)]
            elif calls and text_tools is not None:
                out.append({"role": "assistant", "content": _answer_text(text_tools, m["content"], calls)})
            elif calls:
                out.append({"role": "assistant", "content": m["content"], "tool_calls": [c.hf() for c in calls]})
            else:
                out.append({"role": "assistant" if m["role"] == FUNCTION else m["role"], "content": m["content"]})
            ends.append(len(out))
        return out, ends

    def _apply(self, messages: list[dict[str, Any]], add_generation_prompt: bool,
               tools: list[dict[str, Any]] | None = None) -> str:
        return cast(str, self.tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt,
            enable_thinking=self.enable_thinking,
        ))

    def _render_with_tokenizer(self, messages: Sequence[Mapping[str, Any]], system: str | None,
                               tools: list[dict[str, Any]] | None) -> list[tuple[str, str]]:
        hf, ends = self._hf_messages(messages, system, tools)
        hf_tools = self._hf_tools(tools)
        pairs, done = [], ""
        for i in range(1, len(messages), 2):
            prompt = self._apply(hf[: ends[i - 1]], add_generation_prompt=True, tools=hf_tools)
            full = self._apply(hf[: ends[i]], add_generation_prompt=False, tools=hf_tools)
            if not (prompt.startswith(done) and full.startswith(prompt)):
                raise GymError(
                    "The tokenizer's chat template renders earlier turns differently once later turns are added "
                    "(thinking templates do this), so prompt and answer cannot be separated for the loss. "
                    f"Set `template:` to a named one ({', '.join(sorted(TEMPLATES))})."
                )
            pairs.append((prompt[len(done):], full[len(prompt):]))
            done = full
        return pairs

    def _probe_tools(self) -> ToolSupport:
        """Render a conversation with a call and its result, with and without the tools, and see what shows."""
        conversation: list[dict[str, Any]] = [
            {"role": "user", "content": "Probe."},
            {"role": "assistant", "content": "", "tool_calls": [_PROBE_CALL.hf()]},
            {"role": "tool", "content": "gym_probe_result", "tool_call_id": _PROBE_CALL.id},
            {"role": "assistant", "content": "Done."}]
        try:
            with_tools = self._apply(conversation, add_generation_prompt=False, tools=_PROBE_TOOLS)
            without = self._apply(conversation, add_generation_prompt=False)
        except Exception:  # a template that raises on tool messages cannot render them
            return ToolSupport(False, False, False, None)
        family = next((f for f in TOOL_FORMATS.values() if f.calls_text([_PROBE_CALL]) in with_tools), None)
        if family is None:  # the family's marker, for templates that add ids or spacing of their own
            family = next((TOOL_FORMATS[n] for marker, n in (("[TOOL_CALLS]", "mistral"), ("<tool_call>", "qwen"))
                           if marker in with_tools), None)
        return ToolSupport(renders_tools=with_tools != without, renders_calls=_PROBE_CALL.name in without,
                           renders_results="gym_probe_result" in with_tools, family=family)


def get_chat_format(tokenizer: Any, template: str | None = None, default_system: str | None = None,
                    enable_thinking: bool = True, tool_format: str | None = None) -> ChatFormat:
    if template is None:
        return ChatFormat(tokenizer, None, default_system, enable_thinking, tool_format)
    if template not in TEMPLATES:
        close = difflib.get_close_matches(template, list(TEMPLATES), n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"Unknown template '{template}'.{hint} Known: {', '.join(sorted(TEMPLATES))}.")
    chat = ChatFormat(tokenizer, TEMPLATES[template], default_system, enable_thinking, tool_format)
    _warn_if_disagrees(chat)
    return chat


def trained_chat_format(folder: str | Path, tokenizer: Any) -> ChatFormat:
    """The chat format a Gym output was trained with (its gym_config.yaml); the tokenizer's own otherwise. What
    serves a trained scorer (a reward model, a classifier) renders its inputs with this."""
    config_file = Path(folder) / CONFIG_FILE
    config = (yaml.safe_load(config_file.read_text(encoding="utf-8")) or {}) if config_file.is_file() else {}
    return get_chat_format(tokenizer, config.get("template"), config.get("default_system"),
                           config.get("enable_thinking", True))


def _warn_if_disagrees(chat: ChatFormat) -> None:
    if not getattr(chat.tokenizer, "chat_template", None):
        return
    probe = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    own = ChatFormat(chat.tokenizer, None, chat.default_system, chat.enable_thinking)
    try:
        theirs = "".join(p + r for p, r in own.render_pairs(probe, "S"))
    except Exception:  # a tokenizer template that cannot render this probe tells us nothing
        return
    ours = "".join(p + r for p, r in chat.render_pairs(probe, "S"))
    if ours.strip() != theirs.strip():
        logger.warning(
            "Template '%s' renders conversations differently from this tokenizer's own chat template. "
            "Serve the result with the same template (Gym does so when it reads the saved gym_config.yaml).",
            chat.name,
        )


def named_equivalent(tokenizer: Any) -> tuple[Template, str | None] | None:
    """The named template that renders exactly what this tokenizer's own chat template renders (with a system
    prompt, over one and two turns), and the default system prompt the tokenizer's template adds when none is
    given; None when no named template matches. Lets an export describe the format in another language."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    own = ChatFormat(tokenizer, None)
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
             {"role": "user", "content": "Again"}, {"role": "assistant", "content": "Sure."}]
    for template in TEMPLATES.values():
        named = ChatFormat(tokenizer, template)
        try:
            if any("".join(p + r for p, r in own.render_pairs(turns[:n], "S")) !=
                   "".join(p + r for p, r in named.render_pairs(turns[:n], "S")) for n in (2, 4)):
                continue
            bare = "".join(p + r for p, r in own.render_pairs(turns[:2], None))
        except Exception:  # a tokenizer template that cannot render the probe matches nothing
            return None
        if bare == "".join(p + r for p, r in named.render_pairs(turns[:2], None)):
            return template, None
        before, _, after = "".join(p + r for p, r in named.render_pairs(turns[:2], "\0")).partition("\0")
        if bare.startswith(before) and bare.endswith(after) and len(bare) > len(before) + len(after):
            return template, bare[len(before):len(bare) - len(after)]
    return None
