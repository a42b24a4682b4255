"""A model folder's tokenizer read without importing transformers: what a fast-engine start needs of it.

`import transformers` reads the source of every model it ships to build its lazy import table: ~0.8 s of a warm
`gym chat --prompt` on a 2-core AMD EPYC, whose first token otherwise comes at ~2.1 s, torch's own import (~1.8 s
there) included. Answering needs four things of the tokenizer: the chat template rendered as text, `encode`,
`decode` and the special tokens. transformers' fast tokenizers are the `tokenizers` library underneath, and a chat
template is Jinja, so QuickTokenizer does those four itself, as transformers does them (its Jinja environment:
sandboxed, trim_blocks and lstrip_blocks, loop controls, its `tojson`, `raise_exception`, `strftime_now`,
`namespace` and `dict`; messages' None-valued keys dropped; the special tokens passed to the template), and hands
everything else (other arguments, other methods, setting an attribute) to the transformers tokenizer, loaded at its
first use.

Only folders where both give the same are read this way (`quick_tokenizer` returns None otherwise): a
`tokenizer.json` with transformers' generic fast class in `tokenizer_config.json` (TokenizersBackend or
PreTrainedTokenizerFast), settings among those that class reads without changing the Rust tokenizer, no clean-up of
spaces after decoding, and one chat template as text. Gym's own conversions are such folders.
tests/models/test_quick_tokenizer.py checks each of the four against transformers on the embedded tokenizer.

GYM_QUICK_TOKENIZER=0 turns it off.
"""

from __future__ import annotations

import json
import os
import threading
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

GENERIC_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
# tokenizer_config.json keys those classes read without touching the Rust tokenizer's behaviour. Anything else
# (add_bos_token, add_prefix_space, additional special tokens, legacy, ...) may change what they encode.
PLAIN_KEYS = frozenset({
    "backend", "tokenizer_class", "bos_token", "eos_token", "unk_token", "pad_token", "model_max_length", "is_local",
    "local_files_only", "chat_template", "added_tokens_decoder", "clean_up_tokenization_spaces", "name_or_path",
    "padding_side", "truncation_side", "model_input_names", "errors", "vocab_file", "merges_file",
})
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token")
# apply_chat_template's own arguments (not template variables) that QuickTokenizer leaves to transformers.
TOKENIZING_ARGS = frozenset({"sanitize_control_tokens", "padding", "truncation", "max_length", "return_tensors",
                             "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs"})
_OWN = frozenset({"_folder", "_backend", "_template", "_tokens", "_max_length", "_full", "_lock", "_loader",
                  "_changed"})


def enabled() -> bool:
    return os.environ.get("GYM_QUICK_TOKENIZER", "1").strip().lower() not in ("0", "false", "no", "off")


def quick_tokenizer(folder: str | os.PathLike[str], full_loader: Any) -> QuickTokenizer | None:
    """The folder's tokenizer as a QuickTokenizer, or None where it may differ from transformers' (see above).
    `full_loader()` loads the transformers tokenizer when something beyond the four is asked of it."""
    path = Path(folder)
    if not enabled() or not (path / "tokenizer.json").is_file():
        return None
    try:
        config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if (not isinstance(config, dict) or config.get("tokenizer_class") not in GENERIC_CLASSES
            or not PLAIN_KEYS.issuperset(config) or config.get("clean_up_tokenization_spaces")):
        return None
    template = config.get("chat_template")
    template_file = path / "chat_template.jinja"
    if template is None and template_file.is_file():
        template = template_file.read_text(encoding="utf-8")
    if template is not None and not isinstance(template, str):  # named templates: transformers picks among them
        return None
    tokens = {key: _content(config.get(key)) for key in SPECIAL_TOKENS}
    if any(value is None and config.get(key) is not None for key, value in tokens.items()):
        return None
    from tokenizers import Tokenizer

    try:
        backend = Tokenizer.from_file(str(path / "tokenizer.json"))
    except Exception:  # a file the Rust library cannot read: transformers' loader says what is wrong with it
        return None
    if not _same_added_tokens(backend, config.get("added_tokens_decoder") or {}):
        return None
    # transformers never truncates or pads unless asked to, whatever tokenizer.json says.
    backend.no_truncation()
    backend.no_padding()
    if tokens["pad_token"] is None:  # what gym.models.loader.load_tokenizer does to every tokenizer
        tokens["pad_token"] = tokens["eos_token"]
    if any(token is not None and backend.token_to_id(token) is None for token in tokens.values()):
        return None
    return QuickTokenizer(path, backend, template, tokens, config.get("model_max_length"), full_loader)


def _same_added_tokens(backend: Any, declared: Any) -> bool:
    """Whether tokenizer_config.json's added tokens are tokenizer.json's, flags included: transformers adds the
    config's to the Rust tokenizer, so one marked special only there would be skipped in its decoding alone."""
    if not isinstance(declared, dict):
        return False
    present = backend.get_added_tokens_decoder()
    fields = ("content", "special", "lstrip", "rstrip", "normalized", "single_word")
    for key, entry in declared.items():
        token = present.get(int(key)) if str(key).isdigit() else None
        if token is None or not isinstance(entry, dict):
            return False
        if any(field in entry and entry[field] != getattr(token, field) for field in fields):
            return False
    return True


def _content(token: Any) -> str | None:
    """A special token as tokenizer_config.json holds it: a string, or an AddedToken's fields."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else None


def full_tokenizer(tokenizer: Any) -> Any:
    """The transformers tokenizer behind `tokenizer` (itself when it is one): for libraries that check its type."""
    return tokenizer.full if isinstance(tokenizer, QuickTokenizer) else tokenizer


class _Computed:
    """An attribute QuickTokenizer computes itself, transformers' tokenizer's once anything was set on it."""

    def __init__(self, compute: Any) -> None:
        self.compute = compute

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, tokenizer: Any, owner: type | None = None) -> Any:
        if tokenizer is None:
            return self
        return getattr(tokenizer.full, self.name) if tokenizer._changed else self.compute(tokenizer)


class QuickTokenizer:
    """encode, decode, apply_chat_template and the special tokens of a tokenizer.json folder, computed as the
    transformers tokenizer computes them; any other use goes to that tokenizer (`full`)."""

    def __init__(self, folder: Path, backend: Any, template: str | None, tokens: dict[str, str | None],
                 max_length: int | None, full_loader: Any) -> None:
        set_own = object.__setattr__
        set_own(self, "_folder", folder)
        set_own(self, "_max_length", max_length)
        set_own(self, "_backend", backend)
        set_own(self, "_template", template)
        set_own(self, "_tokens", tokens)
        set_own(self, "_loader", full_loader)
        set_own(self, "_full", None)
        set_own(self, "_lock", threading.Lock())
        set_own(self, "_changed", False)

    # -- what it computes itself (until something is set on it) -------------------------------------------
    name_or_path = _Computed(lambda self: str(self._folder))
    chat_template = _Computed(lambda self: self._template)
    special_tokens_map = _Computed(lambda self: {k: v for k, v in self._tokens.items() if v is not None})
    bos_token = _Computed(lambda self: self._tokens["bos_token"])
    eos_token = _Computed(lambda self: self._tokens["eos_token"])
    unk_token = _Computed(lambda self: self._tokens["unk_token"])
    pad_token = _Computed(lambda self: self._tokens["pad_token"])
    bos_token_id = _Computed(lambda self: self._token_id("bos_token"))
    eos_token_id = _Computed(lambda self: self._token_id("eos_token"))
    unk_token_id = _Computed(lambda self: self._token_id("unk_token"))
    pad_token_id = _Computed(lambda self: self._token_id("pad_token"))
    # The longest input the model takes (the server caps requests with it).
    model_max_length = _Computed(lambda self: int(self._max_length) if type(self._max_length) is int
                                 else int(self.full.model_max_length))

    def _token_id(self, key: str) -> int | None:
        token = self._tokens[key]
        return None if token is None else self._backend.token_to_id(token)

    def encode(self, text: Any, *args: Any, add_special_tokens: bool = True, **kwargs: Any) -> Any:
        if args or kwargs or type(text) is not str or self._changed:
            return self.full.encode(text, *args, add_special_tokens=add_special_tokens, **kwargs)
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: Any, skip_special_tokens: bool = False, **kwargs: Any) -> Any:
        ids = [token_ids] if type(token_ids) is int else token_ids
        if kwargs or self._changed or not isinstance(ids, (list, tuple)) or any(type(i) is not int for i in ids):
            return self.full.decode(token_ids, skip_special_tokens=skip_special_tokens, **kwargs)
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, conversation: Any, tools: Any = None, documents: Any = None,
                            chat_template: str | None = None, add_generation_prompt: bool = False,
                            continue_final_message: bool | str = False, tokenize: bool = True, **kwargs: Any) -> Any:
        """As transformers renders one conversation of plain messages as text; anything else goes to it."""
        plain = (not tokenize and not self._changed and self._template is not None and documents is None
                 and chat_template is None and not continue_final_message and not TOKENIZING_ARGS.intersection(kwargs)
                 and isinstance(conversation, list) and conversation and all(type(m) is dict for m in conversation))
        if plain:
            try:
                messages = [_alias_reasoning(_plain({k: v for k, v in m.items() if v is not None}))
                            for m in conversation]
                variables = _plain({**self.special_tokens_map, **kwargs})
                return _compiled(self._template).render(messages=messages, tools=_plain(tools), documents=None,
                                                        add_generation_prompt=add_generation_prompt, **variables)
            except _NotPlain:
                pass
        return self.full.apply_chat_template(
            conversation, tools=tools, documents=documents, chat_template=chat_template,
            add_generation_prompt=add_generation_prompt, continue_final_message=continue_final_message,
            tokenize=tokenize, **kwargs)

    # -- everything else: the transformers tokenizer --------------------------------------------------
    @property
    def full(self) -> Any:
        """The transformers tokenizer of the folder (loaded once, at the first use that needs it)."""
        with self._lock:
            if self._full is None:
                object.__setattr__(self, "_full", self._loader())
            return self._full

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in _OWN:
            raise AttributeError(name)
        return getattr(self.full, name)

    def __setattr__(self, name: str, value: Any) -> None:
        # Set on transformers' tokenizer, which answers everything from then on (a new chat template, special
        # token or length holds for every method at once).
        setattr(self.full, name, value)
        object.__setattr__(self, "_changed", True)

    def __len__(self) -> int:
        return int(self._backend.get_vocab_size(with_added_tokens=True))

    def __bool__(self) -> bool:
        return True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.full(*args, **kwargs)

    def __reduce__(self) -> Any:
        # Pickled (a worker process, a deep copy) as what it stands for: transformers' tokenizer of the folder.
        return self.full.__reduce__()

    def __repr__(self) -> str:
        return f"QuickTokenizer({self._folder})"


# -- the chat template, rendered as transformers renders it -------------------------------------------------
class _NotPlain(Exception):
    """A value other than JSON data: transformers turns such values into placeholders; it renders those."""


def _plain(value: Any) -> Any:
    """A copy of JSON data (exact types), so a template cannot change the caller's messages."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if type(value) is dict:
        return {_plain(key): _plain(item) for key, item in value.items()}
    if type(value) is list:
        return [_plain(item) for item in value]
    if type(value) is tuple:
        return tuple(_plain(item) for item in value)
    raise _NotPlain


REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _alias_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    """A message's reasoning under the names templates read it by (`reasoning_content`; `thinking` for gpt-oss)."""
    reasoning = next((message[key] for key in REASONING_FIELDS if message.get(key) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


@lru_cache(maxsize=8)
def _compiled(template: str) -> Any:
    return _environment().from_string(template)


@lru_cache(maxsize=1)
def _environment() -> Any:
    """transformers' chat-template environment, built once (at the first render, so jinja2 loads only then)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}` marks what the assistant wrote (for training masks); as text it
        is its content."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_content"), [], [], body).set_lineno(lineno)

        def _content(self, caller: Any) -> str:
            return str(caller())

    class Namespace(jinja2.utils.Namespace):
        """jinja2's namespace, refusing underscore-prefixed attributes (a way into Python's internals)."""

        def __init__(*args: Any, **kwargs: Any) -> None:
            self, rest = args[0], args[1:]
            attributes = dict(*rest, **kwargs)
            for name in attributes:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attributes)

        def __setitem__(self, name: str, value: Any) -> None:
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}.")

    class DictMaker:
        """`dict(...)` and `dict.fromkeys(...)` in a template, without the type itself."""

        def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict.fromkeys(*args, **kwargs)

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        # Not jinja2's own filter, which escapes HTML characters.
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[Generation, jinja2.ext.loopcontrols])
    environment.filters["tojson"] = tojson
    environment.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, dict=DictMaker(),
                               namespace=Namespace)
    return environment
