"""Small helpers for the names users type: comma lists, "did you mean" suggestions, user ids."""

from __future__ import annotations

import difflib
import enum
import re
from collections.abc import Iterable
from typing import TypeVar

from gym.core.errors import ConfigError

MAX_USER_ID = 128
USER_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]*")


def split_names(value: str | None) -> list[str]:
    """`"a, b,,c"` -> ["a", "b", "c"]: the comma-separated lists config keys hold (datasets, adapters, modules)."""
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def closest(name: str, candidates: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The candidate most like `name`, if any is close enough to be a likely typo."""
    found = difflib.get_close_matches(name, list(candidates), n=1, cutoff=cutoff)
    return found[0] if found else None


def did_you_mean(name: str, candidates: Iterable[str], otherwise: str = "") -> str:
    """` Did you mean 'x'?` for a likely typo, else `otherwise` (a sentence saying where the valid names are)."""
    match = closest(name, candidates)
    return f" Did you mean '{match}'?" if match else otherwise


E = TypeVar("E", bound=enum.Enum)


def enum_choice(kind: type[E], value: object, what: str) -> E:
    """`value` as a member of `kind`, or a ConfigError listing the choices (`what` names the setting)."""
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(str(m.value) for m in kind)
        raise ConfigError(f"Unknown {what} {value!r}; choose one of: {choices}.") from None


def check_user_id(user_id: str) -> str:
    """A user id is a name: letters, digits and . _ @ + -, starting with a letter or digit, at most 128
    characters, never '..' (so it can name a folder and never escape the store)."""
    if not isinstance(user_id, str) or not user_id:
        raise ConfigError(f"user id {user_id!r}: give a non-empty string.")
    if len(user_id) > MAX_USER_ID:
        raise ConfigError(f"user id {user_id[:40]!r}...: {len(user_id)} characters, at most {MAX_USER_ID}.")
    if not USER_ID_PATTERN.fullmatch(user_id) or ".." in user_id:
        raise ConfigError(f"user id {user_id!r}: use letters, digits and . _ @ + - (starting with a letter or "
                          "digit, no '..', no path separators).")
    return user_id
