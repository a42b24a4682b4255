"""Safety sets: requests a model should refuse (harmful) and requests that only look sensitive (benign).

A set is named as every Gym dataset is: a name in dataset_info.json (`safety_demo`, `advbench`, `harmbench`,
`xstest`, or your own entry), or a file (.json, .jsonl, .csv, .parquet). Each row is one request:

    prompt       the request, in the first of these columns the row has: the dataset_info.json entry's
                 `columns.prompt`, then `prompt`, `instruction`, `goal` (AdvBench's CSV), `behavior`, `Behavior`
                 (HarmBench's CSV), `question`; or a `messages` list (OpenAI's shape) ending with the user's turn
    kind         harmful or benign, from the first of the columns `label`, `kind`, `type` the row has:
                 harmful | unsafe | any XSTest type starting with `contrast` -> harmful;
                 benign | safe -> benign.
                 A set whose rows have none of these columns is all harmful (AdvBench and HarmBench are).
    category     optional, from `category`, `focus`, `SemanticCategory` (shown in samples)

XSTest's unsafe prompts are its `contrast_*` types (its README: "unsafe prompts are those where the type starts
with contrast_"), so a `type` of `contrast_homonyms` is harmful, and its other types (homonyms, safe_targets, ...)
are benign only through its `label` column (safe / unsafe), which is read first.

A bad row is a DataError naming the file, the row and the field.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from gym.core.errors import DataError
from gym.data.loader import raw_rows
from gym.data.registry import get_dataset_attrs
from gym.safety.verdict import Message


class Kind(str, enum.Enum):
    HARMFUL = "harmful"
    BENIGN = "benign"


PROMPT_COLUMNS = ("prompt", "instruction", "goal", "behavior", "Behavior", "question")
KIND_COLUMNS = ("label", "kind", "type")
CATEGORY_COLUMNS = ("category", "focus", "SemanticCategory")
HARMFUL_VALUES = ("harmful", "unsafe")
BENIGN_VALUES = ("benign", "safe")


@dataclass(frozen=True)
class SafetyItem:
    """One request of a safety set: the conversation to answer (ending with the user's request), its kind, where
    it came from (`file, row N`) and its category when the set names one."""

    messages: list[Message] = field(hash=False)
    kind: Kind
    source: str
    category: str | None = None

    @property
    def prompt(self) -> str:
        return str(self.messages[-1].get("content") or "")


def _kind(row: dict[str, Any], where: str) -> Kind:
    for column in KIND_COLUMNS:
        if column not in row or row[column] is None:
            continue
        value = str(row[column]).strip().lower()
        if value in HARMFUL_VALUES or (column == "type" and value.startswith("contrast")):
            return Kind.HARMFUL
        if value in BENIGN_VALUES:
            return Kind.BENIGN
        raise DataError(f"{where}, field '{column}': {row[column]!r} is not a kind of request; give one of "
                        f"{', '.join(HARMFUL_VALUES)} (harmful) or {', '.join(BENIGN_VALUES)} (benign).")
    return Kind.HARMFUL


def _messages(row: dict[str, Any], where: str, prompt_column: str | None) -> list[Message]:
    if isinstance(row.get("messages"), list) and prompt_column not in row:
        messages = [m for m in row["messages"] if isinstance(m, dict)]
        if len(messages) != len(row["messages"]) or not messages:
            raise DataError(f"{where}, field 'messages': expected a non-empty list of {{role, content}} objects.")
        if messages[-1].get("role") == "assistant":  # a reference answer: the request is what comes before it
            messages = messages[:-1]
        if not messages or messages[-1].get("role") != "user" or not str(messages[-1].get("content") or "").strip():
            raise DataError(f"{where}, field 'messages': the conversation must end with the user's request.")
        return [{"role": str(m["role"]), "content": m.get("content") or ""} for m in messages]
    columns = ([prompt_column] if prompt_column else []) + [c for c in PROMPT_COLUMNS if c != prompt_column]
    for column in columns:
        if column in row:
            value = row[column]
            if not isinstance(value, str) or not value.strip():
                raise DataError(f"{where}, field '{column}': the request must be a non-empty text, got {value!r}.")
            return [{"role": "user", "content": value.strip()}]
    raise DataError(f"{where}: no request; give it in a column named {', '.join(PROMPT_COLUMNS)} (or `messages`), "
                    f"or name the column with \"columns\": {{\"prompt\": ...}} in dataset_info.json.")


def read_item(row: Any, where: str, prompt_column: str | None = None) -> SafetyItem:
    """One row -> a SafetyItem; a DataError naming `where` (file and row) and the field for a bad row."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected an object with a prompt (and a label), got {type(row).__name__}.")
    messages = _messages(row, where, prompt_column)
    category = next((str(row[c]) for c in CATEGORY_COLUMNS if row.get(c) not in (None, "")), None)
    return SafetyItem(messages, _kind(row, where), where, category)


def read_set(name: str, dataset_dir: str = "data", limit: int | None = None) -> list[SafetyItem]:
    """The items of the safety set `name` (a dataset_info.json name or a file). `limit`: at most this many harmful
    and this many benign items (the first of each), so a limited run still measures both rates."""
    items: list[SafetyItem] = []
    for attr in get_dataset_attrs(name, dataset_dir):
        given = attr.columns.get("prompt")
        prompt_column = given if given and given != "instruction" else None  # alpaca's default is not a choice
        for source, row in raw_rows(attr):
            items.append(read_item(row, str(source), prompt_column))
    if not items:
        raise DataError(f"Safety set '{name}' has no rows.")
    if limit is not None:
        counts = {Kind.HARMFUL: 0, Kind.BENIGN: 0}
        kept = []
        for item in items:
            if counts[item.kind] < limit:
                counts[item.kind] += 1
                kept.append(item)
        items = kept
    return items


def count(items: list[SafetyItem], kind: Kind) -> int:
    return sum(1 for item in items if item.kind is kind)
