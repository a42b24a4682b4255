"""The registry of training stages, read by the parser: each stage's name, the kind of data it reads, its options
dataclass, and the module of the training job that runs it.

A stage is declared in the config layer (gym/config/stages/<name>.py: its options and `register(Stage(...))`) and run
by a module of the training job (gym/train/methods/<name>.py: `run(args)`), as TRL keeps `grpo_config.py` apart from
`grpo_trainer.py`. The stage names its trainer by module path, the way transformers' auto classes name model classes,
so reading a config imports neither the training job nor torch. The first lookup loads every package named under the
`gym.methods` entry-point group (Gym's own `gym.config.stages`, and any plugin's), whose import registers its stages.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from gym.core.errors import ConfigError
from gym.core.kinds import DataKind
from gym.core.names import did_you_mean

ENTRY_POINT_GROUP = "gym.methods"
OptionsT = TypeVar("OptionsT")


@dataclass(frozen=True)
class Stage(Generic[OptionsT]):
    """A training stage: `gym train` with `stage: <name>` runs `<trainer>.run(args)` on `data_kind` rows."""

    name: str
    data_kind: DataKind
    trainer: str  # the module whose run(args) trains this stage, e.g. "gym.train.methods.dpo"
    options: type[OptionsT] | None = None
    summary: str = ""  # one line for `gym train --help`
    # Option values the stage stands for: `stage: orpo` is `stage: dpo` with `pref_loss: orpo`.
    fixed: Mapping[str, Any] = field(default_factory=dict)
    # Whether its trainer feeds rows' images, videos and audio to a multimodal model. A stage that does not refuses
    # such rows (gym.train.workflow.prepare): training on their text alone would teach answers about media the model
    # never sees.
    media: bool = False


_REGISTRY: dict[str, Stage[Any]] = {}


def register(stage: Stage[OptionsT]) -> Stage[OptionsT]:
    """Add a stage under its name (a second, different stage with the same name is a bug)."""
    existing = _REGISTRY.get(stage.name)
    if existing is not None and existing != stage:
        raise ValueError(f"two training stages are named {stage.name!r}")
    _REGISTRY[stage.name] = stage
    return stage


def registered_stages() -> Mapping[str, Stage[Any]]:
    """Every stage, by name (loading the registered stage packages on first use)."""
    if not _REGISTRY:
        for entry in entry_points(group=ENTRY_POINT_GROUP):
            entry.load()
        if not _REGISTRY:
            raise RuntimeError(f"No training stage is registered: Gym's package metadata (entry points "
                               f"'{ENTRY_POINT_GROUP}') is missing. Reinstall it: pip install -e .")
    return MappingProxyType(_REGISTRY)


def get_stage(name: str) -> Stage[Any]:
    stages = registered_stages()
    if name not in stages:
        raise ConfigError(f"Unknown stage '{name}'.{did_you_mean(name, stages)} "
                          f"Available: {', '.join(sorted(stages))}.")
    return stages[name]


def option_classes() -> dict[str, type]:
    """Stage name -> its options dataclass, for the stages that have options."""
    return {name: s.options for name, s in registered_stages().items() if s.options is not None}
