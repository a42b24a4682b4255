"""alpaca / sharegpt / openai rows -> one internal form, `Example`.

Every check names the file, the row and the field, because a user with a 50,000-row file needs to
find the one bad row. Which fields are required depends on the data kind the method asks for:
`unsupervised` (pt) needs text, `supervised` (sft) needs at least one assistant answer, `pairwise`
(rm, dpo family) a prompt with a chosen and a rejected answer, `feedback` (kto) an answer and a
desirable/undesirable tag, `prompt` (grpo, rloo, ppo) a prompt ending with a user turn and
optionally a reference answer for verifiable rewards, `labelled` (cls) a conversation with some text in it (a `text`
or instruction row is one user turn) and a class label: a name, or an index into the stage's `labels`.

Any kind may carry images, videos and audios (LLaMA-Factory's media columns, or OpenAI content parts in the
messages): the text keeps a `<image>`-style placeholder where each one goes, and gym.data.media resolves and
checks the files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, overload

from gym.core.errors import DataError
from gym.data.media import KINDS, MediaError, check_counts, flatten_parts, resolve_media
from gym.data.messages import (
    ASSISTANT,
    FUNCTION,
    OBSERVATION,
    SYSTEM,
    USER,
    Message,
    MessageProblem,
    Tags,
    read_conversation,
)
from gym.data.readers import RowSource
from gym.data.registry import DatasetAttr
from gym.data.tools import ToolError, parse_tools

__all__ = ["ASSISTANT", "FUNCTION", "OBSERVATION", "USER", "Example", "convert_row"]


@dataclass
class Example:
    """One conversation: alternating prompt (user/observation) and answer (assistant) messages in the shape
    gym.data.messages describes, plus what some methods add. `tools` is the OpenAI-shaped list of functions the
    conversation offers (checked when the row is read)."""

    source: str
    messages: list[Message] = field(default_factory=list)
    system: str | None = None
    tools: list[dict[str, Any]] | None = None
    chosen: str | None = None  # pairwise: the preferred and the dispreferred next answer
    rejected: str | None = None
    kto_tag: bool | None = None  # feedback: is the last answer desirable?
    answer: str | None = None  # prompt: the reference answer verifiable rewards compare with
    label: str | int | None = None  # labelled: the class, by name or by index into the stage's `labels`
    # media, in placeholder order: resolved file paths or data: URLs (gym.data.media)
    images: list[str] = field(default_factory=list)
    videos: list[str] = field(default_factory=list)
    audios: list[str] = field(default_factory=list)

    def has_media(self) -> bool:
        return bool(self.images or self.videos or self.audios)


def _fail(source: RowSource, field_name: str, problem: str) -> DataError:
    return DataError(f"{source}: field '{field_name}' {problem}")


def _media_fail(source: RowSource, error: MediaError) -> DataError:
    return DataError(f"{source}: field '{error.where}': {error.problem}")


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
            raise _fail(source, column, "is missing." if column in row else _missing(column, row))
        return None
    value = row[column]
    if not isinstance(value, str):
        raise _fail(source, column, f"must be a string, got {type(value).__name__} {str(value)[:40]!r}.")
    if required and not value.strip():
        raise _fail(source, column, "is empty.")
    return value


def _missing(column: str, row: dict[str, Any]) -> str:
    """`is missing`, with the row's own keys, and the mapping a plain-text row needs."""
    keys = ", ".join(repr(k) for k in row) or "none"
    only, inner = next(iter(row.items())) if len(row) == 1 else (None, None)
    if isinstance(inner, list) and inner and isinstance(inner[0], dict) and column in inner[0]:
        # {"data": [rows]}, as some exports write it: read as one row (datasets needs `field=` for it)
        return (f"is missing (the row's keys: {keys}): the file is one JSON object holding its rows in a list under "
                f"'{only}'. A .json dataset is an array of rows (or JSON lines): make that list the whole file.")
    hint = (" For plain text, map it in dataset_info.json: `\"columns\": {\"prompt\": \"text\"}`."
            if "text" in row and column == "instruction" else
            " Map the dataset's own column names in dataset_info.json's `columns`.")
    return f"is missing (the row's keys: {keys}).{hint}"


def convert_row(attr: DatasetAttr, source: RowSource, row: Any, kind: str) -> Example:
    if not isinstance(row, dict):
        raise DataError(f"{source}: expected an object with named fields, got {type(row).__name__}.")
    _check_columns_for(attr, kind)
    part_media: list[tuple[str, str, Any]] = []
    if attr.formatting == "alpaca":
        example = _convert_alpaca(attr, source, row, kind)
    else:
        example = _convert_sharegpt(attr, source, row, kind, part_media)
    if kind == "pairwise":
        example.chosen = _answer_text(attr, source, row, "chosen")
        example.rejected = _answer_text(attr, source, row, "rejected")
    elif kind == "feedback":
        example.kto_tag = _kto_tag(source, row, _required_column(attr, source, "kto_tag"))
    elif kind == "prompt" and (answer_col := attr.column("answer")):
        example.answer = _reference_answer(source, row, answer_col)
    elif kind == "labelled":
        _require_text(attr, source, example)
        example.label = _class_label(source, row, _required_column(attr, source, "label"))
    _attach_media(attr, source, row, example, part_media)
    return example


def _attach_media(attr: DatasetAttr, source: RowSource, row: dict[str, Any], example: Example,
                  part_media: list[tuple[str, str, Any]]) -> None:
    """The row's media columns and content parts -> the example's checked lists (MediaError names the field)."""
    media_dir = Path(attr.media_dir) if attr.media_dir else None
    counts: dict[str, int] = {}
    try:
        for kind in KINDS:
            column = attr.column(kind)
            listed = row.get(column) if column else None
            if listed is not None and not isinstance(listed, list):
                listed = [listed]  # LLaMA-Factory accepts one item as well as a list
            items = [(f"{column}[{i}]", v) for i, v in enumerate(listed or [])]
            parts = [(where, value) for k, where, value in part_media if k == kind]
            if any(value is not None for _, value in parts):
                if items:
                    raise MediaError(str(column), f"and the messages' content parts both give {kind}; give them "
                                     "in one place.")
                items = parts
            resolved = resolve_media(kind, items, media_dir)
            setattr(example, kind, resolved)
            counts[kind] = len(resolved)
        texts = [example.system, *(m.get("content") for m in example.messages)]
        check_counts(counts, texts, str(attr.column("messages") or attr.column("prompt")))
    except MediaError as e:
        raise _media_fail(source, e) from None


_NEEDED_COLUMNS = {
    "pairwise": (("chosen", "rejected"), "set `\"ranking\": true` and map `columns: {chosen: ..., rejected: ...}`"),
    "feedback": (("kto_tag",), "map `columns: {kto_tag: <the column holding true/false>}`"),
    "labelled": (("label",), "map `columns: {label: <the column holding each row's class>}`"),
}


# What a stage reading each kind of data is called, for the errors (a DataKind prints as its class name).
_KIND_WORDS = {"supervised": "supervised (sft) data", "feedback": "feedback (kto) data", "pairwise": "preference data",
               "prompt": "prompt data", "labelled": "labelled (cls) data", "unsupervised": "plain-text (pt) data"}


def _kind_words(kind: str) -> str:
    name = str(getattr(kind, "value", kind))
    return _KIND_WORDS.get(name, f"{name} data")


def _check_columns_for(attr: DatasetAttr, kind: str) -> None:
    # As in LLaMA-Factory, a dataset of pairs feeds only the pairwise stages (prompt data may take its prompts).
    if attr.ranking and kind in ("supervised", "feedback", "unsupervised", "labelled"):
        raise DataError(f"Dataset '{attr.name}' holds preference pairs (`\"ranking\": true` in dataset_info.json), "
                        f"and this stage reads {_kind_words(kind)}: train it with a "
                        "preference stage (dpo, orpo, simpo, cpo, rm), or choose a dataset of that kind.")
    if kind not in _NEEDED_COLUMNS:
        return
    needed, how = _NEEDED_COLUMNS[kind]
    missing = [c for c in needed if not attr.column(c)]
    if missing:
        what = {"pairwise": "preference pairs", "feedback": "desirable/undesirable labels"}.get(kind, "class labels")
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


def _class_label(source: RowSource, row: dict[str, Any], column: str) -> str | int:
    """A class: its name (a non-empty string), or its index into the stage's `labels` (an integer >= 0)."""
    value = row.get(column)
    if value is None:
        raise _fail(source, column, "is missing: every row needs its class.")
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # CSV and parquet readers turn integer columns with gaps into floats
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and value.strip():
        return value.strip()
    if isinstance(value, str):
        raise _fail(source, column, "is empty: every row needs its class.")
    raise _fail(source, column, f"must be a class name (a string) or its index in `labels` (an integer >= 0), "
                f"got {value!r}.")


def _require_text(attr: DatasetAttr, source: RowSource, example: Example) -> None:
    """A row to classify must hold some text (an empty prompt column is refused as it is read)."""
    if not any(str(m.get("content") or "").strip() for m in example.messages):
        raise _fail(source, str(attr.column("messages") or attr.column("prompt")), "holds no text to classify.")


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
    messages: list[Message] = []
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


def _convert_sharegpt(attr: DatasetAttr, source: RowSource, row: dict[str, Any], kind: str,
                      part_media: list[tuple[str, str, Any]]) -> Example:
    column = _required_column(attr, source, "messages")
    if column not in row:
        raise _fail(source, column, _missing(column, row))
    raw = _flatten_content_parts(source, row[column], column, attr.tag("content_tag"), part_media)
    roles = {
        attr.tag("system_tag"): SYSTEM, attr.tag("user_tag"): USER, attr.tag("assistant_tag"): ASSISTANT,
        attr.tag("observation_tag"): OBSERVATION, attr.tag("function_tag"): FUNCTION,
    }
    if (attr.tag("user_tag"), attr.tag("assistant_tag")) == ("human", "gpt"):
        # ShareGPT files in the wild (the Gym documents' own example among them) write "from": "user"/"assistant" too
        roles.setdefault("user", USER)
        roles.setdefault("assistant", ASSISTANT)
    try:
        system, messages = read_conversation(raw, Tags(attr.tag("role_tag"), attr.tag("content_tag"), roles),
                                             column)
    except MessageProblem as e:
        raise _fail(source, e.field, e.problem) from None
    system_col = attr.column("system")
    if system is None and system_col:
        system = _string(source, row, system_col, required=False)
    ends_with_answer = bool(messages) and messages[-1]["role"] == ASSISTANT
    if kind in ("supervised", "feedback") and not ends_with_answer:
        raise _fail(source, column, f"must end with an assistant message for {_kind_words(kind)}.")
    # The last answer is what the model learns to say; an alpaca row's empty output is refused the same way.
    if kind in ("supervised", "feedback") and not messages[-1].get("tool_calls") and not str(
            messages[-1]["content"]).strip():
        raise _fail(source, f"{column}[{len(raw) - 1}].{attr.tag('content_tag')}",
                    "is empty: the last answer is what the model learns to say.")
    if kind == "prompt" and ends_with_answer:
        messages = messages[:-1]  # an answer in the row is not part of the prompt
    if kind in ("pairwise", "prompt") and (not messages or messages[-1]["role"] not in (USER, OBSERVATION)):
        raise _fail(source, column, f"must end with a user message for {kind} data (the answers come separately).")
    return Example(source=str(source), messages=messages, system=system, tools=_tools(attr, source, row))


def _flatten_content_parts(source: RowSource, raw: Any, column: str, content_tag: str,
                           part_media: list[tuple[str, str, Any]]) -> Any:
    """Messages whose content is a list of OpenAI parts with media -> the same messages with text content holding
    placeholders; the media go to `part_media` as (kind, field, value). Text-only part lists are left to
    gym.data.messages, which joins them as it does for requests."""
    if not isinstance(raw, list):
        return raw
    flat = []
    for i, message in enumerate(raw):
        content = message.get(content_tag) if isinstance(message, dict) else None
        if isinstance(content, list) and any(isinstance(p, dict) and p.get("type") != "text" for p in content):
            try:
                text, media = flatten_parts(content, f"{column}[{i}].{content_tag}")
            except MediaError as e:
                raise _media_fail(source, e) from None
            part_media += media
            message = {**message, content_tag: text}
        flat.append(message)
    return flat


def _tools(attr: DatasetAttr, source: RowSource, row: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The row's tools column, checked now (a broken one would otherwise surface mid-training, or never)."""
    column = attr.column("tools")
    if not column or row.get(column) is None:
        return None
    try:
        return parse_tools(row[column]) or None
    except ToolError as e:
        raise _fail(source, column, f"is not a valid tool list: {e}.") from None
