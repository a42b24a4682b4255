"""gym/config/hf_training_fields.py is Hugging Face's TrainingArguments written out as plain fields, so that a config
parses without importing transformers (and torch). This test renders that file from the installed transformers and
compares: a transformers upgrade that adds, drops or changes a field shows up here, with the command to regenerate.

    GYM_WRITE_HF_FIELDS=1 python -m pytest tests/config/test_hf_training_fields.py   # rewrite the file
"""

from __future__ import annotations

import dataclasses
import enum
import os
import re
import types
import typing
from pathlib import Path
from typing import Any

import pytest

TARGET = Path(__file__).resolve().parents[2] / "src" / "gym" / "config" / "hf_training_fields.py"

HEADER = '''"""Hugging Face's `TrainingArguments` fields, written out so that parsing a config imports neither
transformers nor torch. GENERATED from transformers {version} by tests/config/test_hf_training_fields.py, which fails
when the installed transformers disagrees; regenerate with
`GYM_WRITE_HF_FIELDS=1 python -m pytest tests/config/test_hf_training_fields.py`.

Enum-typed fields are Literals of the enum's values, so a misspelt value is refused with the closest one when the config
is read; the train layer builds the real `transformers.TrainingArguments` from these values (gym.train.hf_args).
"""

# ruff: noqa: E501

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

TRANSFORMERS_VERSION = "{version}"


@dataclass
class HFTrainingFields:
    """Hugging Face's training keys (the TrainingArguments of transformers {version})."""

'''


def _plain_type(tp: Any) -> str:
    """A field's annotation as source text that needs no transformers import."""
    if tp is type(None):
        return "None"
    if tp is Any:
        return "Any"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "Literal[" + ", ".join(repr(m.value) for m in tp) + "]"
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        members = typing.get_args(tp)
        if any(isinstance(m, type) and issubclass(m, enum.Enum) for m in members):
            # `SchedulerType | str`: transformers turns the string into the enum, so only its values are valid.
            members = tuple(m for m in members if m is not str)
        parts: list[str] = []
        for member in members:
            if typing.get_origin(member) is typing.Literal and typing.get_args(member) == (False,):
                member = bool
            text = _plain_type(member)
            if text not in parts and text != "None":
                parts.append(text)
        if type(None) in members:
            parts.append("None")
        return " | ".join(parts)
    if origin is list:
        (inner,) = typing.get_args(tp) or (Any,)
        if isinstance(inner, type) and issubclass(inner, enum.Enum):
            return "list[str]"
        return f"list[{_plain_type(inner)}]"
    if origin is dict or tp is dict:
        args = typing.get_args(tp)
        return f"dict[{_plain_type(args[0])}, {_plain_type(args[1])}]" if args else "dict[str, Any]"
    if isinstance(tp, type) and tp.__module__ == "builtins":
        return tp.__name__
    return "Any"  # a library object (accelerate's ParallelismConfig): not given from YAML, passed through as is


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        return f"field(default_factory={type(value).__name__}"
    value = f.default
    if isinstance(value, enum.Enum):
        value = value.value
    return f"field(default={value!r}"


def render() -> str:
    import transformers

    hints = typing.get_type_hints(transformers.TrainingArguments)
    lines = [HEADER.format(version=transformers.__version__)]
    for f in dataclasses.fields(transformers.TrainingArguments):
        if not f.init:
            continue
        help_text = " ".join(str(f.metadata.get("help", "")).split())
        annotation = _plain_type(hints[f.name])
        lines.append(f"    {f.name}: {annotation} = {_default(f)}, metadata={{'help': {help_text!r}}})\n")
    return "".join(lines)


def _installed_version() -> str:
    import transformers

    return str(transformers.__version__)


def _recorded_version() -> str:
    match = re.search(r'^TRANSFORMERS_VERSION = "([^"]+)"', TARGET.read_text(encoding="utf-8"), re.M)
    assert match, f"{TARGET} has no TRANSFORMERS_VERSION line"
    return match.group(1)


def test_the_written_fields_are_those_of_the_installed_transformers():
    expected = render()
    if os.environ.get("GYM_WRITE_HF_FIELDS"):
        TARGET.write_text(expected, encoding="utf-8")
    if _recorded_version() != _installed_version():
        pytest.skip(f"hf_training_fields.py was written from transformers {_recorded_version()}, this is "
                    f"{_installed_version()}: regenerate it (see this file's docstring); the subset test still runs")
    assert TARGET.read_text(encoding="utf-8") == expected, (
        "gym/config/hf_training_fields.py differs from the installed transformers' TrainingArguments: regenerate it "
        "with GYM_WRITE_HF_FIELDS=1 python -m pytest tests/config/test_hf_training_fields.py")


def test_every_written_field_exists_in_transformers_with_the_same_default():
    """Whatever transformers version is installed, a key Gym accepts is one its TrainingArguments takes, and an unset
    key means what transformers means by it (Gym passes only the values that differ from these defaults)."""
    import transformers

    from gym.config.hf_training_fields import HFTrainingFields

    theirs = {f.name: f for f in dataclasses.fields(transformers.TrainingArguments) if f.init}
    for ours in dataclasses.fields(HFTrainingFields):
        assert ours.name in theirs, f"transformers.TrainingArguments has no field {ours.name!r}: regenerate"
        if ours.default_factory is not dataclasses.MISSING:
            assert ours.default_factory() == theirs[ours.name].default_factory()  # type: ignore[misc]
        else:
            default = theirs[ours.name].default
            assert ours.default == getattr(default, "value", default), ours.name


def test_the_written_tracker_names_are_those_of_the_installed_transformers():
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    from gym.config.tracking import INTEGRATIONS

    assert set(INTEGRATIONS) == set(INTEGRATION_TO_CALLBACK), "update INTEGRATIONS in gym/config/tracking.py"
