"""The experience library Training-Free GRPO learns: short lessons, numbered, shown to the model in its prompt.

The library is a list of texts whose position is the id (`[0]. text`, `[1]. text`, ...). The updater
LLM proposes operations on those ids; `apply` turns them into the next library with fixed rules, so
what the library becomes never depends on the order the LLM wrote things in beyond what is stated:

1. An operation is ADD, UPDATE (or MODIFY), DELETE or NONE, in any case; a missing one counts as ADD, as
   in the authors' code. NONE changes nothing; another word makes the answer malformed (asked again).
2. DELETE beats UPDATE: an id that is both deleted and updated is deleted. DELETE of an unknown id does
   nothing; DELETE needs no content.
3. Several UPDATEs of one id: the last one wins (the batch updater is asked to merge them first).
4. UPDATE of an id the library does not have is an ADD (the authors' rule).
5. ADDs whose text equals (ignoring case, spaces and punctuation) an experience already in the library,
   or an earlier ADD of the same step, are merged into it: they add nothing.
6. ADD/UPDATE with empty content are dropped; content longer than `max_words` words is cut there.
7. The result keeps the surviving experiences in their order, updated in place, then the ADDs in the
   order given; ids are renumbered from 0.

So: size after = size before + distinct ADDs (with UPDATEs of unknown ids) - DELETEs of existing ids.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gym.core.errors import DataError
from gym.core.files import temp_path

logger = logging.getLogger(__name__)

DEFAULT_MAX_WORDS = 32
OPERATIONS = ("ADD", "UPDATE", "DELETE", "NONE")

# How a non-empty library is shown to the model: after the system prompt the user gave (if any).
EXPERIENCE_HEADER = ("Lessons learned from earlier attempts at similar tasks. Read them first, and use the ones "
                     "that apply:")


@dataclass(frozen=True)
class Operation:
    """One proposed change: `op` on experience `id` (None for ADD) with `content` (None for DELETE/NONE)."""

    op: str
    id: int | None = None
    content: str | None = None

    @classmethod
    def parse(cls, raw: Any) -> Operation:
        """From the updater's JSON object {"operation", "id", "content"}; raises ValueError when malformed."""
        if not isinstance(raw, Mapping):
            raise ValueError(f"an operation must be a JSON object, got {type(raw).__name__}")
        op = str(raw.get("operation") or raw.get("option") or "ADD").strip().upper()
        op = {"MODIFY": "UPDATE"}.get(op, op)  # the authors' math updater says modify
        if op not in OPERATIONS:
            raise ValueError(f"unknown operation {op!r} (expected one of {', '.join(OPERATIONS)})")
        ident = raw.get("id", raw.get("modified_from"))
        if isinstance(ident, str):
            ident = ident.strip().lstrip("[G").rstrip("]") or None
        if ident is not None:
            try:
                ident = int(ident)
            except (TypeError, ValueError):
                raise ValueError(f"experience id {raw.get('id')!r} is not a number") from None
        content = raw.get("content", raw.get("experience"))
        content = None if content is None else str(content).strip()
        return cls(op, ident, content or None)

    def as_json(self) -> dict[str, Any]:
        return {"operation": self.op, "id": self.id, "content": self.content}


def _key(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def _clip(text: str, max_words: int) -> str:
    words = text.split()
    if len(words) <= max_words:
        return " ".join(words)
    logger.info("An experience of %d words was cut to %d: %r", len(words), max_words, text[:80])
    return " ".join(words[:max_words])


@dataclass
class ExperienceLibrary:
    """The lessons (position = id) and the training step that produced them (0: empty, before training)."""

    experiences: list[str] = field(default_factory=list)
    step: int = 0

    def __len__(self) -> int:
        return len(self.experiences)

    def __iter__(self) -> Iterator[str]:
        return iter(self.experiences)

    def __getitem__(self, index: int) -> str:
        return self.experiences[index]

    def as_dict(self) -> dict[int, str]:
        return dict(enumerate(self.experiences))

    def render(self) -> str:
        """The numbered list, one `[i]. text` per line ("" when empty)."""
        return "\n".join(f"[{i}]. {text}" for i, text in enumerate(self.experiences))

    def apply(self, operations: Iterable[Operation], max_words: int = DEFAULT_MAX_WORDS) -> ExperienceLibrary:
        """The next library (step + 1) under the rules in this module's docstring."""
        deleted: set[int] = set()
        updates: dict[int, str] = {}
        adds: list[str] = []
        for op in operations:
            if op.op == "DELETE":
                if op.id is not None and 0 <= op.id < len(self.experiences):
                    deleted.add(op.id)
            elif op.op in ("ADD", "UPDATE") and op.content:
                text = _clip(op.content, max_words)
                if op.op == "UPDATE" and op.id is not None and 0 <= op.id < len(self.experiences):
                    updates[op.id] = text
                else:
                    adds.append(text)
        kept = [updates.get(i, text) for i, text in enumerate(self.experiences) if i not in deleted]
        seen = {_key(text) for text in kept}
        for text in adds:
            if _key(text) not in seen:
                seen.add(_key(text))
                kept.append(text)
        return ExperienceLibrary(kept, self.step + 1)

    # ------------------------------------------------------------ files

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "experiences": self.as_dict()}

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write as JSON under a temporary name, then rename: a reader never sees half a library."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_path(path)
        tmp.write_text(json.dumps(self.to_json(), ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)
        return path

    @classmethod
    def from_json(cls, data: Any, where: str = "experiences") -> ExperienceLibrary:
        """From {"step", "experiences": {id: text}} (ours), a bare {id: text} or a list of texts."""
        step = 0
        if isinstance(data, Mapping) and "experiences" in data:
            step = _step(data.get("step"), where)
            data = data["experiences"]
        if isinstance(data, Mapping):
            try:
                items = sorted((int(str(k).lstrip("G")), v) for k, v in data.items())
            except ValueError:
                raise DataError(f"{where}: experience ids must be numbers ('3' or 'G3').") from None
            data = [text for _, text in items]
        if not isinstance(data, list) or not all(isinstance(t, str) for t in data):
            raise DataError(f"{where}: expected {{\"experiences\": {{\"0\": \"text\", ...}}}} or a list of texts.")
        return cls([t.strip() for t in data if t.strip()], step)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ExperienceLibrary:
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise DataError(f"{path}: no such experience library (the experiences.json a TF-GRPO run writes).") \
                from None
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg}).") from None
        except ValueError as exc:  # not UTF-8 text, or a number of more digits than Python reads
            raise DataError(f"{path}: not a JSON text file ({exc}).") from None
        except IsADirectoryError:
            raise DataError(f"{path}: a folder; give the experiences.json file a TF-GRPO run wrote.") from None
        return cls.from_json(data, str(path))


def _step(value: Any, where: str) -> int:
    """The training step a library came from: a whole number >= 0 (missing or null: 0), as JSON or as text."""
    if value is None:
        return 0
    number: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = None
    # 1e400 reads as inf and "abc" as nothing: int() of either raises, and gym api would stop with a traceback
    if number is None or not math.isfinite(number) or number < 0 or number != int(number):
        raise DataError(f"{where}: 'step' must be a whole number >= 0, got {_shown(value, number)} (the training "
                        "step the library comes from; leave it out for 0).")
    return int(number)


def _shown(value: Any, number: float | None) -> str:
    return repr(value) if number is None or isinstance(value, str) else f"{number:g}"


def with_experiences(system: str | None, library: ExperienceLibrary | None) -> str | None:
    """The system prompt with the library appended; exactly `system` when the library is empty or None."""
    if library is None or not len(library):
        return system
    block = f"{EXPERIENCE_HEADER}\n{library.render()}"
    return f"{system.rstrip()}\n\n{block}" if system else block
