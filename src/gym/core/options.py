"""What Gym's Python options classes (BitDeltaConfig, DeltaQuantConfig, GRPOConfig, DeltaSoupConfig) share: a
constructor that answers a misspelt keyword as the YAML parser answers a misspelt key, and the value checks their
`__post_init__` make, each naming the field and what it takes."""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Any, TypeVar

from gym.core.errors import ConfigError, UnknownField
from gym.core.names import closest

T = TypeVar("T")


def strict_fields(cls: type[T]) -> type[T]:
    """A dataclass whose constructor refuses a keyword that is not one of its fields with `UnknownField`, naming the
    closest field (Python's own TypeError names only the keyword). Apply it above `@dataclass`."""
    init = cls.__init__
    names = [f.name for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        unknown = sorted(key for key in kwargs if key not in names)
        if unknown:
            raise unknown_field(cls.__name__, unknown, names)
        init(self, *args, **kwargs)

    setattr(cls, "__init__", __init__)  # noqa: B010 (mypy refuses assigning to a method)
    return cls


def unknown_field(owner: str, unknown: list[str], names: list[str]) -> UnknownField:
    """The error for keywords `owner` does not take: the closest field to the first, else every field."""
    match = closest(unknown[0], names)
    if match is not None:
        return UnknownField(f"Unknown {owner} field {unknown[0]!r}. Did you mean {match!r}?")
    return UnknownField(f"Unknown {owner} field(s): {', '.join(unknown)}; known: {', '.join(sorted(names))}.")


def check_bool(name: str, value: object) -> None:
    """True or False: a string such as "no" would be taken as true."""
    if not isinstance(value, bool):
        raise ConfigError(f"'{name}' must be True or False, got {value!r}.")


def check_whole(name: str, value: object, low: int, optional: bool = False) -> None:
    """A whole number of at least low (None too, when optional). A bool is not a count."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"'{name}' must be a whole number of at least {low}{' or None' if optional else ''}, "
                          f"got {value!r}.")


def check_number(name: str, value: object, low: float | None = None, high: float | None = None, *,
                 low_open: bool = False, high_open: bool = False, optional: bool = False) -> None:
    """A finite number within the bounds given (None: unbounded on that side), or None when optional."""
    if value is None and optional:
        return
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    above = low is None or (number > low if low_open else number >= low)
    below = high is None or (number < high if high_open else number <= high)
    if math.isfinite(number) and above and below:
        return
    if low is not None and high is not None:
        what = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    elif low is not None:
        what = f"a number {'>' if low_open else '>='} {low:g}"
    elif high is not None:
        what = f"a number {'<' if high_open else '<='} {high:g}"
    else:
        what = "a finite number"
    raise ConfigError(f"'{name}' must be {what}{' or None' if optional else ''}, got {value!r}.")


def check_seed(name: str, value: object) -> None:
    """A whole number torch's generators take: -2^63 to 2^64 - 1."""
    if isinstance(value, bool) or not isinstance(value, int) or not -(2**63) <= value < 2**64:
        raise ConfigError(f"'{name}' must be a whole number from -2^63 to 2^64 - 1, got {value!r}.")


def check_path(name: str, value: object, optional: bool = False) -> Any:
    """A name or a path, as the str the options' JSON record holds (a Path is taken too); None when optional."""
    if value is None and optional:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"'{name}' must be a dataset name or a path{' or None' if optional else ''}, got {value!r}.")
    return value
