"""Constrained decoding: a request's answer must match a grammar (a JSON schema, any JSON object, or a lark
grammar), enforced token by token by llguidance (Microsoft's Rust grammar library).

A `Constraint` is what a request asks for; it is checked when it is made (a bad schema or grammar raises
ConfigError with one line saying what is wrong, before any engine sees the request). An engine that
honours constraints gives each such request a `Matcher` at submit (gym.infer.batching): before a token is
chosen, `Matcher.mask` sets the logits of every token the grammar does not allow to -inf
(gym.infer.sampling), and after it is chosen `Matcher.advance` moves the grammar on (gym.infer.emit).
The model's end-of-turn tokens are allowed exactly when the grammar accepts what is written so far; once
the grammar can produce nothing more, the request ends with reason "stop" without waiting for one.

Why llguidance (bench/grammar_libraries.py, docs/benchmarks.md): it compiles a schema in under a
millisecond (xgrammar ~10 ms, outlines-core ~70 ms: a tool-call request brings its own schemas, so this is
paid per request), its masks cost ~11 µs per token (xgrammar ~4 µs, outlines-core ~4 µs; a CPU decode step
of the embedded model is milliseconds), it has no torch dependency (xgrammar pulls triton and torch), and
its lark grammars embed JSON schemas (`%json {...}`), which tool calls need: literal text around a
schema-valid object, several times, one of several functions. outlines-core is regex-only (no recursion,
so not even "any JSON object").

JSON is laid out one way: one space after ':' and ',', no other whitespace (`JSON_LAYOUT`). Allowing free
whitespace lets a model that is unsure (an untrained one, or any at a high temperature) pad with spaces
and newlines until max_new_tokens instead of writing the object.

The lark subset (llguidance's dialect of Lark, Earley parsing; the whole grammar is one text):

    start: item ("," item)*        rules are lowercase; `start` is where the answer begins
    item: "literal" | NUMBER | obj  "..." is literal text (JSON string escapes; build one with lark_literal)
    NUMBER: /[0-9]+/                UPPERCASE names are terminals; /.../ is a regex (Rust syntax, no lookaround)
    obj: %json {"type": "object"}   a JSON schema in place of a rule body (free whitespace unless its
                                    "x-guidance" says otherwise: json_lark() puts JSON_LAYOUT there)
    x?  x*  x+  x{2}  x{1,3}  (a b) | alternatives, grouping and repetition
    <|im_end|>  <[2]>               a special token by its text or by its id (outside terminals only)
    %import common.WS               the only imports; no priorities, templates or lazy `?` in regexes

Tool calls are built with `tagged_json`: each call is literal text, JSON matching one function's schema,
literal text, and calls repeat min_count..max_count times with a separator between them.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

import llguidance
import llguidance.numpy
import numpy as np
import torch

from gym.core.errors import ConfigError, GymError
from gym.core.names import closest
from gym.models.quick_tokenizer import full_tokenizer

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # in the type stub only

# The JSON layout of every schema Gym compiles (llguidance's JSON options; see the module docstring).
JSON_LAYOUT: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class ConstraintKind(str, Enum):
    JSON_OBJECT = "json_object"
    JSON_SCHEMA = "json_schema"
    LARK = "lark"


@dataclass(frozen=True)
class Constraint:
    """What a request's answer must match. `source` is what the caller gave (the schema as JSON text, or
    the lark text); `grammar` is llguidance's compiled form, checked when the constraint is made."""

    kind: ConstraintKind
    source: str
    grammar: str = field(repr=False)


def json_object() -> Constraint:
    """Any JSON object (OpenAI's `response_format: {"type": "json_object"}`)."""
    return _checked(ConstraintKind.JSON_OBJECT, '{"type": "object"}',
                    llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_LAYOUT))


# JSON Schema's keywords (draft 2020-12, the older `definitions`, `dependencies`, `additionalItems`, and OpenAPI's
# `example` and `nullable`, which schemas written for OpenAPI carry): a key near one of them is taken for its typo.
SCHEMA_KEYWORDS = frozenset((
    "$schema", "$id", "$ref", "$anchor", "$dynamicRef", "$dynamicAnchor", "$vocabulary", "$comment", "$defs",
    "definitions", "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas", "prefixItems", "items",
    "contains", "properties", "patternProperties", "additionalProperties", "propertyNames", "unevaluatedItems",
    "unevaluatedProperties", "additionalItems", "dependencies", "type", "enum", "const", "multipleOf", "maximum",
    "exclusiveMaximum", "minimum", "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems", "minItems",
    "uniqueItems", "maxContains", "minContains", "maxProperties", "minProperties", "required", "dependentRequired",
    "format", "contentEncoding", "contentMediaType", "contentSchema", "title", "description", "default",
    "deprecated", "readOnly", "writeOnly", "examples", "example", "nullable"))
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")  # name -> schema
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_SCHEMA_ONE = ("additionalProperties", "items", "not", "if", "then", "else", "contains", "propertyNames",
               "unevaluatedItems", "unevaluatedProperties", "additionalItems", "contentSchema")
TYPO_CUTOFF = 0.8  # closer than this to a keyword: `requried`, `maxlength`, `propertes`, `enums`


def check_keywords(schema: Any) -> None:
    """Refuse a key of `schema` (or of any schema inside it) that is a misspelt keyword: JSON Schema ignores keys it
    does not know, so `requried: [...]` required nothing and the answer left the property out, without a word.
    Walked with a stack, not recursion: a request's schema may nest as deep as its JSON parses."""
    stack: list[tuple[Any, str]] = [(schema, "")]
    while stack:
        node, where = stack.pop()
        if not isinstance(node, Mapping):
            continue
        for key, value in node.items():
            path = f"{where}.{key}" if where else str(key)
            if isinstance(key, str) and key not in SCHEMA_KEYWORDS and not key.startswith("x-"):
                match = closest(key, SCHEMA_KEYWORDS, cutoff=TYPO_CUTOFF) or next(
                    (k for k in SCHEMA_KEYWORDS if k.lower() == key.lower()), None)
                if match is not None:
                    raise ConfigError(f"Invalid JSON schema: {path!r} is not a JSON Schema keyword (one it does not "
                                      f"know is ignored, so it would constrain nothing). Did you mean '{match}'?")
            if key in _SCHEMA_MAPS and isinstance(value, Mapping):
                stack.extend((sub, f"{path}.{name}") for name, sub in value.items())
            elif key in _SCHEMA_LISTS and isinstance(value, list):
                stack.extend((sub, f"{path}.{i}") for i, sub in enumerate(value))
            elif key in _SCHEMA_ONE:
                stack.append((value, path))


def json_schema(schema: Mapping[str, Any]) -> Constraint:
    """JSON that validates against `schema` (draft 2020-12 as llguidance implements it; a keyword it does
    not implement is an error, not silently ignored, and so is a misspelt one: check_keywords)."""
    if not isinstance(schema, Mapping):
        raise ConfigError(f"A JSON schema must be an object, not {type(schema).__name__}.")
    check_keywords(schema)
    try:
        source = json.dumps(schema)
        grammar = llguidance.LLMatcher.grammar_from_json_schema(source, defaults=JSON_LAYOUT)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"Invalid JSON schema: {_one_line(str(exc))}") from None
    return _checked(ConstraintKind.JSON_SCHEMA, source, grammar)


def lark(grammar_text: str) -> Constraint:
    """A lark grammar (the subset in this module's docstring) whose `start` rule the answer must match."""
    if not isinstance(grammar_text, str) or not grammar_text.strip():
        raise ConfigError("A lark grammar must be non-empty text with a `start` rule.")
    return _checked(ConstraintKind.LARK, grammar_text, llguidance.LLMatcher.grammar_from_lark(grammar_text))


def lark_literal(text: str, special_tokens: Collection[str] = ()) -> str:
    """`text` as a lark expression matching exactly that text. Where text contains one of `special_tokens`
    (e.g. "<tool_call>" on a tokenizer that has it as one special token), that part becomes a reference
    to the token: a special token's text written out in ordinary tokens is not the special token, and a
    model trained on the token would never write it that way. The result is one item (parenthesised
    when it has several parts), so it can stand anywhere an expression can."""
    parts: list[str] = []
    rest = text
    specials = sorted((s for s in special_tokens if s), key=len, reverse=True)
    while rest:
        hits = [(rest.find(s), s) for s in specials if s in rest]
        if not hits:
            parts.append(json.dumps(rest, ensure_ascii=False))
            break
        at, token = min(hits, key=lambda hit: (hit[0], -len(hit[1])))
        if at:
            parts.append(json.dumps(rest[:at], ensure_ascii=False))
        parts.append(token)
        rest = rest[at + len(token):]
    if not parts:
        return '""'
    return parts[0] if len(parts) == 1 else "(" + " ".join(parts) + ")"


def json_lark(schema: Mapping[str, Any] | None) -> str:
    """A lark rule body matching JSON valid against `schema` (None: any JSON object) in JSON_LAYOUT."""
    body: dict[str, Any] = dict(schema) if schema is not None else {"type": "object"}
    body["x-guidance"] = {**JSON_LAYOUT, **body.get("x-guidance", {})}
    return "%json " + json.dumps(body)


@dataclass(frozen=True)
class Tagged:
    """Literal text, then JSON matching `schema` (None: any JSON object), then literal text: one tool call,
    e.g. Tagged('<tool_call>\\n{"name": "get_weather", "arguments": ', {...arguments schema...}, '}\\n</tool_call>')."""

    prefix: str
    schema: Mapping[str, Any] | None
    suffix: str = ""


def tagged_json(choices: Sequence[Tagged], *, min_count: int = 1, max_count: int | None = 1, separator: str = "",
                special_tokens: Collection[str] = ()) -> Constraint:
    """Between `min_count` and `max_count` (None: no limit) items with `separator` between them, each item
    one of `choices`. `tool_choice: required` with parallel calls: min_count=1, max_count=None, one choice
    per function; a named function: that function's choice only. `special_tokens`: the tokenizer's special
    tokens that may appear in the literal texts (see lark_literal)."""
    if not choices:
        raise ConfigError("tagged_json needs at least one choice (for tool calls: at least one function).")
    if min_count < 0 or (max_count is not None and max_count < max(min_count, 1)):
        raise ConfigError(f"tagged_json: counts {min_count}..{max_count} are not a range with at least one item.")
    lines = []
    for index, choice in enumerate(choices):
        lines.append(f"json_{index}: {json_lark(choice.schema)}")
        lines.append(f"item_{index}: {lark_literal(choice.prefix, special_tokens)} json_{index} "
                     f"{lark_literal(choice.suffix, special_tokens)}")
    lines.append("item: " + " | ".join(f"item_{index}" for index in range(len(choices))))
    tail = f"({lark_literal(separator, special_tokens)} item)" if separator else "item"
    fewest = max(min_count - 1, 0)  # items after the first
    if max_count == 1:
        repeated = "item"
    elif max_count is None:
        repeated = f"item {tail}*" if fewest == 0 else f"item {tail}{{{fewest},}}"
    else:
        repeated = f"item {tail}{{{fewest},{max_count - 1}}}"
    lines.append(f"start: {repeated}" if min_count > 0 else f"start: ({repeated})?")
    return lark("\n".join(lines))


def _checked(kind: ConstraintKind, source: str, grammar: str) -> Constraint:
    error = llguidance.LLMatcher.validate_grammar(grammar)
    if error:
        what = "grammar" if kind is ConstraintKind.LARK else "JSON schema"
        raise ConfigError(f"Invalid {what}: {_one_line(error)}")
    return Constraint(kind, source, grammar)


def _one_line(message: str) -> str:
    """llguidance's errors run over several lines (a caret under the grammar's text); the first says what."""
    return message.strip().splitlines()[0] if message.strip() else "unknown error"


class GrammarStopped(GymError):
    """A constrained answer the grammar library gave up on part way (Finished.reason "error"): what was written
    need not match the schema, so it is an error and never an answer. llguidance does this on a schema with no
    finite instance, e.g. a required property that refers back to its own object: the text it must force is
    endless, and it stops at its item limit."""

    def __init__(self, error: str, tokens: int) -> None:
        super().__init__(f"Constrained decoding stopped after {tokens} token{'s' if tokens != 1 else ''}: the "
                         f"grammar library could not go on ({error}). A schema that no finite JSON matches (a "
                         "required property that refers back to its own object) does this; make the recursion "
                         "optional or simplify the schema.")
        self.error = error


# -- per request ----------------------------------------------------------------------------------------

_TOKENIZERS: weakref.WeakKeyDictionary[Any, llguidance.LLTokenizer] = weakref.WeakKeyDictionary()
_TOKENIZERS_LOCK = threading.Lock()


def grammar_tokenizer(tokenizer: Any) -> llguidance.LLTokenizer:
    """llguidance's view of a transformers tokenizer: every token's bytes, built once per tokenizer
    (~0.3 s for a 49k vocabulary) and kept as long as the tokenizer lives."""
    with _TOKENIZERS_LOCK:
        cached = _TOKENIZERS.get(tokenizer)
        if cached is None:
            import llguidance.hf

            try:
                cached = llguidance.hf.from_tokenizer(full_tokenizer(tokenizer))
            except ValueError as exc:  # a slow (Python) tokenizer: llguidance reads the Rust tokenizer's JSON
                raise ConfigError(f"Constrained decoding needs a fast tokenizer: {exc}") from None
            _TOKENIZERS[tokenizer] = cached
        return cached


class Matcher:
    """One request's place in its constraint's grammar. `stop_token_ids`: the engine's end-of-turn tokens,
    allowed whenever the grammar accepts what is written so far."""

    def __init__(self, constraint: Constraint, tokenizer: Any, stop_token_ids: Collection[int]) -> None:
        lltokenizer = grammar_tokenizer(tokenizer)
        self._matcher = llguidance.LLMatcher(lltokenizer, constraint.grammar, log_level=0)
        if self._matcher.is_error():  # what only the tokenizer can tell, e.g. a special token it lacks
            raise ConfigError(f"Invalid grammar for this model's tokenizer: {_one_line(self._matcher.get_error())}")
        self.vocab_size = lltokenizer.vocab_size
        self._bitmask = llguidance.numpy.allocate_token_bitmask(1, self.vocab_size)
        self._stop = np.array([t for t in stop_token_ids if 0 <= t < self.vocab_size], dtype=np.int64)
        self.error = ""

    def mask(self, logits: torch.Tensor) -> None:
        """Set the logits (one row, any device, modified in place) of the tokens the grammar does not allow
        next to -inf."""
        llguidance.numpy.fill_next_token_bitmask(self._matcher, self._bitmask)
        words = self._bitmask.view(np.uint32)[0]
        if len(self._stop) and self._matcher.is_accepting():
            np.bitwise_or.at(words, self._stop >> 5, np.left_shift(1, self._stop & 31).astype(np.uint32))
        allowed = np.unpackbits(words.view(np.uint8), bitorder="little")[:self.vocab_size].view(bool)
        width = logits.shape[-1]
        if logits.device.type == "cpu":
            # numpy's boolean assignment: torch's masked_fill_ costs milliseconds in thread hand-offs on a
            # loaded CPU for a 49k row, numpy ~50 µs.
            row = logits.numpy()
            row[:min(width, self.vocab_size)][~allowed[:width]] = -np.inf
            row[self.vocab_size:] = -np.inf  # a padded vocabulary's extra logits are no tokens at all
        else:
            keep = torch.zeros(width, dtype=torch.bool)
            keep[:min(width, self.vocab_size)] = torch.from_numpy(allowed[:width])
            logits.masked_fill_(~keep.to(logits.device, non_blocking=True), float("-inf"))

    def allows(self, token: int) -> bool:
        """Whether the last `mask` allowed `token` (stop tokens included)."""
        if not 0 <= token < self.vocab_size:
            return False
        return bool(int(self._bitmask.view(np.uint32)[0, token >> 5]) >> (token & 31) & 1)

    def advance(self, token: int) -> bool:
        """Move past the chosen `token`; True when the answer is complete (the grammar can produce nothing
        more), or when the grammar could not take the token (`error` says why; a bug, as masked sampling
        only picks allowed tokens)."""
        if not self._matcher.consume_token(token):
            self.error = _one_line(self._matcher.get_error())
            return True
        return self._matcher.is_stopped()

    @property
    def accepting(self) -> bool:
        """Whether what is written so far is a complete answer."""
        return self._matcher.is_accepting()
