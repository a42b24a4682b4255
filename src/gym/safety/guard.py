"""The one interface every guard offers, and `load_guard(spec)`, which reads the spec a user gives.

Specs (`--guard SPEC` of `gym api`, the safety evaluation's judge, the gates):

    keywords:FILE            a list of regular expressions, one per line (see KeywordGuard)
    classifier:PATH          a transformers sequence-classification model (what `gym train` stage cls makes)
    llama-guard:PATH         Llama Guard 3 (1B, 8B) and its format
    shieldgemma:PATH         ShieldGemma (2B, 9B, 27B)
    qwen3guard:PATH          Qwen3Guard-Gen
    granite-guardian:PATH    Granite Guardian 3.x
    PATH                     a model folder or hub id; its family is read from its config and chat template

A guard judges the LAST message of a conversation: a user message is checked as input, an assistant message as
output, with the messages before it as context (the guards whose formats take context use it; keyword lists and
classifiers read the message alone).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from gym.core.errors import ConfigError
from gym.core.names import did_you_mean
from gym.safety.base import Guard
from gym.safety.verdict import Message, Verdict, last_text

__all__ = ["FAMILIES", "Guard", "KeywordGuard", "load_guard", "parse_spec"]

FAMILIES = ("keywords", "classifier", "llama-guard", "shieldgemma", "qwen3guard", "granite-guardian")


class KeywordGuard(Guard):
    """A list of regular expressions, searched case-insensitively in the judged message.

    The file holds one pattern per line. Blank lines and lines starting with `#` are skipped, except
    `# category: NAME`, which files the patterns below it under NAME (until the next such line; before the first,
    they are filed under `keywords`). A message is flagged when any pattern matches anywhere in it. This is the
    smallest guard: it catches exactly what it lists, misses every paraphrase, and needs no model."""

    def __init__(self, path: str | Path) -> None:
        self.spec = f"keywords:{path}"
        self.patterns: list[tuple[str, re.Pattern[str]]] = []
        category = "keywords"
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            raise ConfigError(f"Guard keywords file {path} does not exist.") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"Guard keywords file {path} cannot be read: {exc}.") from None
        for number, line in enumerate(lines, start=1):
            stripped = line.strip()
            header = re.fullmatch(r"#\s*category\s*:\s*(\S.*)", stripped, flags=re.IGNORECASE)
            if header:
                category = header.group(1).strip()
                continue
            if not stripped or stripped.startswith("#"):
                continue
            try:
                self.patterns.append((category, re.compile(stripped, flags=re.IGNORECASE)))
            except re.error as exc:
                raise ConfigError(f"{path}, line {number}: {stripped!r} is not a regular expression ({exc}).") \
                    from None
        if not self.patterns:
            raise ConfigError(f"Guard keywords file {path} lists no pattern (one regular expression per line).")
        self.categories = tuple(dict.fromkeys(name for name, _ in self.patterns))

    def check_batch(self, conversations: Sequence[list[Message]]) -> list[Verdict]:
        verdicts = []
        for conversation in conversations:
            text = last_text(conversation)
            hits = {name: False for name in self.categories}
            for name, pattern in self.patterns:
                if not hits[name] and pattern.search(text):
                    hits[name] = True
            verdicts.append(Verdict(any(hits.values()), hits, {k: float(v) for k, v in hits.items()}))
        return verdicts


def parse_spec(spec: str) -> tuple[str | None, str]:
    """(family or None to detect it, target) of a guard spec."""
    spec = spec.strip()
    if not spec:
        raise ConfigError("A guard spec is empty: give keywords:FILE, a model folder or hub id, or FAMILY:PATH "
                          f"with FAMILY one of {', '.join(FAMILIES)}.")
    family, colon, target = spec.partition(":")
    if colon and family in FAMILIES:
        if not target.strip():
            raise ConfigError(f"Guard spec {spec!r} names no {'file' if family == 'keywords' else 'model'} after "
                              f"'{family}:'.")
        return family, target.strip()
    if colon and re.fullmatch(r"[a-z0-9][a-z0-9_-]*", family) and not Path(spec).exists() and len(family) > 1:
        raise ConfigError(f"Unknown guard family {family!r}.{did_you_mean(family, FAMILIES)} Give one of "
                          f"{', '.join(FAMILIES)}, or a model folder without a prefix.")
    return None, spec


def load_guard(spec: str, *, threshold: float = 0.5) -> Guard:
    """The guard `spec` names (see the module docstring); model guards flag at score >= `threshold`."""
    if not 0.0 < threshold < 1.0:
        raise ConfigError(f"A guard's threshold is a probability strictly between 0 and 1, got {threshold}.")
    family, target = parse_spec(spec)
    if family == "keywords":
        return KeywordGuard(target)
    from gym.safety.model_guards import load_model_guard

    return load_model_guard(family, target, spec=spec, threshold=threshold)
