"""Chat templates: how a conversation becomes text, split into (prompt, response) pieces.

By default Gym uses the tokenizer's own chat template, so a model is trained in exactly the format
it is served in. Named templates are small declarative definitions for tokenizers that have none,
or for choosing a format on purpose; Gym warns when a named template disagrees with the
tokenizer's own. Every response piece ends with the model's end-of-turn token, so trained models stop.
"""

from __future__ import annotations

import difflib
import logging
from dataclasses import dataclass
from typing import Any, TypedDict, cast

from gym.core.errors import ConfigError, GymError

logger = logging.getLogger(__name__)

EMPTY_THOUGHT = "<think>\n\n</think>\n\n"


@dataclass(frozen=True)
class Template:
    """A chat format. `{content}` marks where text goes; `{eos}` is the tokenizer's EOS token.

    `user` ends with the assistant header, so a rendered prompt is ready for the answer.
    `system` empty means the format has no system turn: the system text is put before the first
    user message instead.
    """

    name: str
    user: str
    assistant: str
    system: str = ""
    prefix: str = ""
    observation: str | None = None
    default_system: str | None = None
    thinking: bool = False


class _TemplateTurns(TypedDict):
    system: str
    user: str
    assistant: str
    observation: str


_CHATML = _TemplateTurns(
    system="<|im_start|>system\n{content}<|im_end|>\n",
    user="<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n",
    assistant="{content}<|im_end|>\n",
    observation="<|im_start|>tool\n{content}<|im_end|>\n<|im_start|>assistant\n",
)

TEMPLATES: dict[str, Template] = {
    t.name: t
    for t in [
        Template("chatml", **_CHATML),
        Template("qwen", **_CHATML,
                 default_system="You are Qwen, created by Alibaba Cloud. You are a helpful assistant."),
        Template("qwen3", **_CHATML, thinking=True),
        Template("qwen3_nothink", **_CHATML),  # LLaMA-Factory's name for Qwen3 with thinking off
        Template(
            "llama3",
            prefix="<|begin_of_text|>",
            system="<|start_header_id|>system<|end_header_id|>\n\n{content}<|eot_id|>",
            user="<|start_header_id|>user<|end_header_id|>\n\n{content}<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
            assistant="{content}<|eot_id|>",
            observation="<|start_header_id|>ipython<|end_header_id|>\n\n{content}<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
        ),
        Template("mistral", prefix="<s>", user="[INST] {content}[/INST]", assistant="{content}</s>"),
        Template(
            "gemma",
            prefix="<bos>",
            user="<start_of_turn>user\n{content}<end_of_turn>\n<start_of_turn>model\n",
            assistant="{content}<end_of_turn>\n",
        ),
        Template("default", system="System: {content}\n", user="Human: {content}\nAssistant: ",
                 assistant="{content}{eos}\n"),
        Template(
            "alpaca",
            user="### Instruction:\n{content}\n\n### Response:\n",
            assistant="{content}{eos}\n\n",
            system="{content}\n\n",
            default_system="Below is an instruction that describes a task. "
            "Write a response that appropriately completes the request.",
        ),
    ]
}


def _fill(fmt: str, content: str, eos: str) -> str:
    # str.replace, not str.format: user text may contain braces.
    return fmt.replace("{eos}", eos).replace("{content}", content)


class ChatFormat:
    """Renders conversations for one tokenizer, with either a named template or the tokenizer's own."""

    def __init__(self, tokenizer: Any, template: Template | None, default_system: str | None = None,
                 enable_thinking: bool = True) -> None:
        if template is None and not getattr(tokenizer, "chat_template", None):
            raise ConfigError("This tokenizer has no chat template of its own: set `template:` to one of "
                              f"{', '.join(sorted(TEMPLATES))}.")
        self.tokenizer = tokenizer
        self.template = template
        self.default_system = default_system
        self.enable_thinking = enable_thinking

    @property
    def name(self) -> str:
        return self.template.name if self.template else "tokenizer"

    def render_pairs(self, messages: list[dict[str, str]], system: str | None = None) -> list[tuple[str, str]]:
        """A conversation ending with an assistant turn -> [(prompt text, response text)] per assistant turn.

        Concatenating every piece gives the whole conversation as the template renders it.
        """
        system = system or self.default_system
        if self.template is None:
            return self._render_with_tokenizer(messages, system)
        return self._render_named(messages, system)

    def render_prompt(self, messages: list[dict[str, str]], system: str | None = None) -> str:
        """A conversation ending with a user turn -> the text that asks the model for the next answer."""
        system = system or self.default_system
        if self.template is None:
            return self._apply(self._hf_messages(messages, system), add_generation_prompt=True)
        # The prompt of the turn to come is exactly its training prompt piece (which already holds the
        # empty thought when thinking is off), after the earlier turns as trained.
        *history, (last_prompt, _) = self._render_named(messages + [{"role": "assistant", "content": ""}], system)
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
    def _render_named(self, messages: list[dict[str, str]], system: str | None) -> list[tuple[str, str]]:
        t, eos = self.template, self.tokenizer.eos_token or ""
        assert t is not None, "only called for a named template"
        system = system or t.default_system
        head = t.prefix + (_fill(t.system, system, eos) if system and t.system else "")
        pairs = []
        for i in range(0, len(messages) - 1, 2):
            query, answer = messages[i], messages[i + 1]
            content = query["content"]
            if i == 0 and system and not t.system:
                content = f"{system}\n\n{content}"
            fmt = t.observation if query["role"] == "observation" and t.observation else t.user
            prompt = (head if i == 0 else "") + _fill(fmt, content, eos)
            response = answer["content"]
            if t.thinking and "<think>" not in response:
                # Qwen3 renders an empty thought for non-thinking answers. With thinking off it is part
                # of the prompt (what inference sends); with thinking on the model learns to emit it.
                if self.enable_thinking:
                    response = EMPTY_THOUGHT + response
                else:
                    prompt += EMPTY_THOUGHT
            pairs.append((prompt, _fill(t.assistant, response, eos)))
        return pairs

    # -- the tokenizer's own template -----------------------------------------------------------
    @staticmethod
    def _hf_messages(messages: list[dict[str, str]], system: str | None) -> list[dict[str, str]]:
        roles = {"observation": "tool", "function": "assistant"}
        out = [{"role": "system", "content": system}] if system else []
        return out + [{"role": roles.get(m["role"], m["role"]), "content": m["content"]} for m in messages]

    def _apply(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return cast(str, self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt,
            enable_thinking=self.enable_thinking,
        ))

    def _render_with_tokenizer(self, messages: list[dict[str, str]], system: str | None) -> list[tuple[str, str]]:
        hf = self._hf_messages(messages, system)
        offset = 1 if system else 0
        pairs, done = [], ""
        for i in range(1, len(messages), 2):
            prompt = self._apply(hf[: offset + i], add_generation_prompt=True)
            full = self._apply(hf[: offset + i + 1], add_generation_prompt=False)
            if not (prompt.startswith(done) and full.startswith(prompt)):
                raise GymError(
                    "The tokenizer's chat template renders earlier turns differently once later turns are added "
                    "(thinking templates do this), so prompt and answer cannot be separated for the loss. "
                    f"Set `template:` to a named one ({', '.join(sorted(TEMPLATES))})."
                )
            pairs.append((prompt[len(done):], full[len(prompt):]))
            done = full
        return pairs


def get_chat_format(tokenizer: Any, template: str | None = None, default_system: str | None = None,
                    enable_thinking: bool = True) -> ChatFormat:
    if template is None:
        return ChatFormat(tokenizer, None, default_system, enable_thinking)
    if template not in TEMPLATES:
        close = difflib.get_close_matches(template, list(TEMPLATES), n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"Unknown template '{template}'.{hint} Known: {', '.join(sorted(TEMPLATES))}.")
    chat = ChatFormat(tokenizer, TEMPLATES[template], default_system, enable_thinking)
    _warn_if_disagrees(chat)
    return chat


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


# -- the same format as a Jinja chat template (for exports: transformers, vLLM, llama.cpp read it) -----------

def _jinja_text(text: str) -> str:
    """`text` as a Jinja string literal expression."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


def _jinja_turn(fmt: str, eos: str, content: str) -> str:
    """A turn format as a Jinja expression around the variable `content`."""
    before, _, after = _fill(fmt, "\0", eos).partition("\0")
    return f"{_jinja_text(before)} ~ {content} ~ {_jinja_text(after)}"


def jinja_chat_template(template: Template, eos: str, default_system: str | None = None,
                        enable_thinking: bool = True) -> str:
    """A Jinja chat template that renders what ChatFormat renders with `template`: the same text for a conversation
    ending with an assistant turn, and the same prompt with `add_generation_prompt` after a user turn. Since Gym's
    user turn ends with the assistant header, a conversation ending with a user turn gets the header either way."""
    t = template
    system = default_system or t.default_system
    user = _jinja_turn(t.user, eos, "content")
    observation = _jinja_turn(t.observation, eos, "content") if t.observation else user
    empty_thought = _jinja_text(EMPTY_THOUGHT)
    parts = [
        "{%- set thinking = enable_thinking if enable_thinking is defined else "
        f"{'true' if enable_thinking else 'false'} -%}}",
        "{%- if messages and messages[0]['role'] == 'system' -%}"
        "{%- set system = messages[0]['content'] -%}{%- set turns = messages[1:] -%}"
        f"{{%- else -%}}{{%- set system = {_jinja_text(system) if system else 'none'} -%}}"
        "{%- set turns = messages -%}{%- endif -%}",
        f"{{{{- {_jinja_text(t.prefix)} -}}}}",
    ]
    if t.system:
        parts.append(f"{{%- if system -%}}{{{{- {_jinja_turn(t.system, eos, 'system')} -}}}}{{%- endif -%}}")
    parts.append("{%- for message in turns -%}{%- set content = message['content'] -%}")
    if not t.system:
        parts.append("{%- if loop.first and system -%}{%- set content = system ~ '\\n\\n' ~ content -%}{%- endif -%}")
    parts.append("{%- if message['role'] != 'assistant' -%}"
                 f"{{%- if message['role'] in ['tool', 'observation'] -%}}{{{{- {observation} -}}}}"
                 f"{{%- else -%}}{{{{- {user} -}}}}{{%- endif -%}}")
    if t.thinking:
        # Thinking off: every answer without a thought gets the empty one in its prompt, as in _render_named.
        parts.append("{%- if not thinking and (loop.last or '<think>' not in turns[loop.index0 + 1]['content']) -%}"
                     f"{{{{- {empty_thought} -}}}}{{%- endif -%}}")
    parts.append("{%- else -%}")
    if t.thinking:
        parts.append("{%- if '<think>' not in content -%}{%- if thinking -%}"
                     f"{{%- set content = {empty_thought} ~ content -%}}{{%- endif -%}}{{%- endif -%}}")
    parts.append(f"{{{{- {_jinja_turn(t.assistant, eos, 'content')} -}}}}{{%- endif -%}}{{%- endfor -%}}")
    return "".join(parts)


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
