"""`gym train --help`, generated from the config dataclasses and the method registry."""

from __future__ import annotations

import dataclasses
from typing import Any

from gym.config.aliases import KEY_ALIASES
from gym.config.coerce import type_name
from gym.config.parser import CONCERNS, fields_of
from gym.config.stages.registry import registered_stages
from gym.core.kinds import DataKind


def field_default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        default = f.default
    elif f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
    else:
        default = None
    return getattr(default, "value", default)


def _mixins(cls: type) -> list[type]:
    """Gym's own dataclasses a concern is assembled from (ModelArguments <- BaseQuantizationArguments, ...)."""
    return [base for base in cls.__bases__ if dataclasses.is_dataclass(base) and base.__module__.startswith("gym.")]


def _section(title: str, cls: type) -> list[str]:
    """The concern's own keys first, then each mixin's under its own heading (so `model_name_or_path`
    leads the model section, though the dataclass lists inherited fields first)."""
    mixins = _mixins(cls)
    inherited = {name for mixin in mixins for name in fields_of(mixin)}
    lines = [f"{title}:"]
    for name, (tp, f) in fields_of(cls).items():
        if name not in inherited:
            lines.append(_key_line(name, tp, f))
    lines.append("")
    for mixin in mixins:
        doc = (mixin.__doc__ or mixin.__name__).strip().splitlines()[0]
        lines += _section(f"{title}: {doc[0].lower()}{doc[1:].rstrip('.')}", mixin)
    return lines


def _key_line(name: str, tp: Any, f: dataclasses.Field[Any]) -> str:
    text = " ".join(str(f.metadata.get("help", "")).split())
    return f"  {name} ({type_name(tp)}, default {field_default(f)!r})\n      {text}"


def train_help() -> str:
    kinds = list(DataKind)
    methods = dict(sorted(registered_stages().items(), key=lambda item: (kinds.index(item[1].data_kind), item[0])))
    lines = ["usage: gym train CONFIG.yaml [key=value ...] [--key value ...]", "", "stages:"]
    lines += [f"  {name:<6} {m.summary} (data: {m.data_kind.value})" for name, m in methods.items()]
    lines.append("")
    stages_of: dict[type, list[str]] = {}
    for name, method in methods.items():
        if method.options is not None:
            stages_of.setdefault(method.options, []).append(name)
    for title, cls in CONCERNS.items():
        lines += _section(title, cls)
    for cls, stages in stages_of.items():
        lines += _section(f"{'/'.join(stages)} options", cls)
    lines.append("aliases: " + ", ".join(f"{k} -> {v}" for k, v in KEY_ALIASES.items()))
    return "\n".join(lines)
