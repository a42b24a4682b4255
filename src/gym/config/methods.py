"""The registry of training methods, read by the parser and filled by the methods themselves.

A method file (gym/train/methods/<name>.py) ends with `register(Method(...))`: its stage name, the
kind of data it reads, its options dataclass and its run function. The parser never imports method
modules: the first lookup loads every module named under the `gym.methods` entry-point group
(Gym's own `gym.train.methods`, and any installed package's), whose import registers its methods.
So a new method is one file plus one line in gym/train/methods/__init__.py, and a plugin package
adds methods without touching Gym.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from gym.config.args import TrainArgs
from gym.core.errors import ConfigError
from gym.core.kinds import DataKind
from gym.core.names import did_you_mean
from gym.core.results import RunResult

ENTRY_POINT_GROUP = "gym.methods"
OptionsT = TypeVar("OptionsT")


@dataclass(frozen=True)
class Method(Generic[OptionsT]):
    """A training method: `gym train` with `stage: <name>` runs `run(args)` on `data_kind` rows."""

    name: str
    data_kind: DataKind
    run: Callable[[TrainArgs[OptionsT]], RunResult]
    options: type[OptionsT] | None = None
    summary: str = ""  # one line for `gym train --help`


_REGISTRY: dict[str, Method[Any]] = {}


def register(method: Method[OptionsT]) -> Method[OptionsT]:
    """Add a method under its stage name (a second, different method with the same name is a bug)."""
    existing = _REGISTRY.get(method.name)
    if existing is not None and existing is not method:
        raise ValueError(f"two training methods are named {method.name!r}")
    _REGISTRY[method.name] = method
    return method


def registered_methods() -> Mapping[str, Method[Any]]:
    """Every method, by stage name (loading the registered method packages on first use)."""
    if not _REGISTRY:
        for entry in entry_points(group=ENTRY_POINT_GROUP):
            entry.load()
        if not _REGISTRY:
            raise RuntimeError(f"No training method is registered: Gym's package metadata (entry points "
                               f"'{ENTRY_POINT_GROUP}') is missing. Reinstall it: pip install -e .")
    return MappingProxyType(_REGISTRY)


def get_method(stage: str) -> Method[Any]:
    methods = registered_methods()
    if stage not in methods:
        raise ConfigError(f"Unknown stage '{stage}'.{did_you_mean(stage, methods)} "
                          f"Available: {', '.join(sorted(methods))}.")
    return methods[stage]


def option_classes() -> dict[str, type]:
    """Stage name -> its options dataclass, for the stages that have options."""
    return {name: m.options for name, m in registered_methods().items() if m.options is not None}
