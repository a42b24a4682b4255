"""Turn a YAML / CLI value into a dataclass field's type, or say exactly what was expected."""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
from typing import Any, Literal, Union

from gym.core.errors import ConfigError
from gym.core.names import did_you_mean

_BOOL_WORDS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}
_NULL_WORDS = ("None", "null", "Null", "NULL")
# YAML 1.1 (PyYAML, and so every config file and `key=value`) reads no/off/yes/on as booleans: `save_strategy: no`
# arrives as False. Where a choice is spelled that way, the boolean is that choice.
_BOOL_SPELLINGS = {False: ("no", "off", "false"), True: ("yes", "on", "true")}


def type_name(tp: Any) -> str:
    """A field type in words, for errors and `gym train --help`."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(type_name(a) for a in typing.get_args(tp) if a is not type(None))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of " + ", ".join(repr(m.value) for m in tp)
    plain = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return plain.get(tp, getattr(tp, "__name__", str(tp)))


def _expected(key: str, tp: Any, value: Any, hint: str = "") -> ConfigError:
    return ConfigError(f"'{key}' expects {type_name(tp)}, got {value!r}.{hint}")


def _choice_spelled_as(value: Any, choices: list[Any]) -> Any:
    """The one choice a YAML boolean stands for (False -> 'no' where 'no' is a choice), else `value` as it was."""
    if isinstance(value, bool):
        spelled = [choice for choice in choices if choice in _BOOL_SPELLINGS[value]]
        if len(spelled) == 1:
            return spelled[0]
    return value


def _union(key: str, value: Any, tp: Any) -> Any:
    members = typing.get_args(tp)
    if type(None) in members and (value is None or (isinstance(value, str) and value in _NULL_WORDS)):
        return None
    # Prefer an exact type match before trying conversions (so "8" stays a str for `int | str`).
    for member in members:
        plain = isinstance(member, type) and not issubclass(member, enum.Enum)
        if member is not type(None) and plain and type(value) is member:
            return value
    for member in members:
        if member is type(None):
            continue
        try:
            return coerce(key, value, member)
        except ConfigError:
            continue
    raise _expected(key, tp, value)


def _mapping(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict):
            return parsed
    raise ConfigError(f"'{key}' expects a mapping (YAML mapping or JSON object), got {value!r}.")


def _scalar(key: str, value: Any, tp: type) -> Any:
    """bool / int / float / str, accepting the spellings YAML and the command line produce."""
    if isinstance(value, tp) and not (tp is not bool and isinstance(value, bool)):
        return value
    if tp is bool and isinstance(value, str) and value.lower() in _BOOL_WORDS:
        return _BOOL_WORDS[value.lower()]
    if tp is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (int, float) and isinstance(value, str):
        try:
            return tp(value)  # YAML 1.1 reads "1e-4" as a string; accept it as a number
        except ValueError:
            pass
    if tp is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if tp is str and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ",".join(value)  # `dataset: [a, b]` means `dataset: a,b`
    raise _expected(key, tp, value)


def coerce(key: str, value: Any, tp: Any) -> Any:
    """Convert `value` to the field type `tp`, or raise a ConfigError that says what was expected."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return _union(key, value, tp)
    if origin is Literal:
        allowed = typing.get_args(tp)
        value = _choice_spelled_as(value, list(allowed))
        if value in allowed:
            return value
        raise _expected(key, tp, value, did_you_mean(str(value), map(str, allowed)))
    if origin is list:
        (inner,) = typing.get_args(tp) or (Any,)
        items = value if isinstance(value, list) else [v for v in str(value).split(",") if v.strip()]
        return [coerce(key, v.strip() if isinstance(v, str) else v, inner) for v in items]
    if origin is dict or tp is dict:
        return _mapping(key, value)
    if tp in (bool, int, float, str):
        return _scalar(key, value, tp)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(_choice_spelled_as(value, [m.value for m in tp]))
        except ValueError:
            raise _expected(key, tp, value, did_you_mean(str(value), [str(m.value) for m in tp])) from None
    # Types we do not check (e.g. accelerate objects): hand them to the dataclass as they are.
    return value


def split_keys(config: dict[str, Any], owner: type, aliases: dict[str, str] | None = None
               ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the keys dataclass `owner` declares, coerced to their field types; the rest as given). Dashes read as
    underscores and `aliases` map short spellings (`--format`) to field names. For verbs whose own keys sit
    beside the model keys of `gym chat` (export, eval)."""
    hints = typing.get_type_hints(owner)
    names = {f.name for f in dataclasses.fields(owner)}
    own: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for raw_key, value in config.items():
        key = str(raw_key).replace("-", "_")
        key = (aliases or {}).get(key, key)
        if key in names:
            own[key] = coerce(key, value, hints[key])
        else:
            rest[raw_key] = value
    return own, rest
