"""Reward functions for the online RL stages (grpo, gspo, rloo, ppo), chosen by name in the config.

    reward_funcs: [accuracy, format]        # or "accuracy,format"
    reward_weights: [1.0, 0.5]              # optional, all 1.0 by default

Every entry is `name` or `name:argument` (`length:80`, `format:<regex>`, `regex:<pattern>`, `reward_model:saves/rm`,
`python:my_rewards:score`). Each resolves to a callable with TRL's reward signature,
`fn(prompts, completions, **columns) -> list[float | None]`, so the same list feeds TRL's trainers
and our own PPO loop (through `combined_reward`). A None reward means "not applicable to this row".

To add a reward: write a factory `name_reward(arg: str | None) -> RewardFunc` (in gym.train.verifiers
for a rule on the text) and add it to REWARD_FUNCS below. Users can also bring their own without
touching Gym: `python:my_module:my_function`.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gym.config.args import TrainArgs
from gym.core.errors import ConfigError, GymError, IncompleteConfig
from gym.core.names import did_you_mean
from gym.train.reward_model import load_reward_model, reward_model_reward
from gym.train.verifiers import (
    RewardFunc,
    accuracy_reward,
    exact_reward,
    format_reward,
    length_reward,
    regex_reward,
)

__all__ = ["REWARD_FUNCS", "RewardChoice", "RewardFunc", "combined_reward", "get_reward_funcs", "load_reward_model",
           "rewards_of"]


# ---------------------------------------------------------------- user code

def python_reward(arg: str | None) -> RewardFunc:
    target, _, attr = (arg or "").rpartition(":")
    if not target or not attr:
        raise ConfigError(
            f"reward `python:{arg or ''}`: write python:<module>:<function> or python:<file.py>:<function>."
        )
    spec_text = f"python:{arg}"
    if target.endswith(".py") or "/" in target or os.sep in target:
        file = Path(target).expanduser().resolve()
        if not file.is_file():
            raise ConfigError(f"reward `{spec_text}`: file not found: {file}")
        name = f"gym_user_rewards_{file.stem}"
        spec = importlib.util.spec_from_file_location(name, file)
        if spec is None or spec.loader is None:
            raise ConfigError(f"reward `{spec_text}`: {file} cannot be imported as a Python module.")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and pickling look the module up by name
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[name]
            raise ConfigError(f"reward `{spec_text}`: importing {file} failed: {exc!r}") from exc
    else:
        if os.getcwd() not in sys.path:  # so a rewards.py next to the config is importable, as users expect
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(target)
        except Exception as exc:
            raise ConfigError(f"reward `{spec_text}`: cannot import module '{target}': {exc!r}") from exc
    fn = getattr(module, attr, None)
    if fn is None:
        raise ConfigError(f"reward `{spec_text}`: module '{target}' has no attribute '{attr}'.")
    if not callable(fn):
        raise ConfigError(f"reward `{spec_text}`: '{attr}' is not callable (it is a {type(fn).__name__}).")

    @functools.wraps(fn)
    def checked(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        rewards = fn(prompts=prompts, completions=completions, **kwargs)
        expected = f"expected a list of {len(completions)} numbers (or None), one per completion"
        if not isinstance(rewards, (list, tuple)):
            raise GymError(f"Reward function `{spec_text}` returned a {type(rewards).__name__}; {expected}.")
        if len(rewards) != len(completions):
            raise GymError(f"Reward function `{spec_text}` returned {len(rewards)} values; {expected}.")
        bad = [r for r in rewards if r is not None and (isinstance(r, bool) or not isinstance(r, (int, float)))]
        if bad:
            raise GymError(f"Reward function `{spec_text}` returned {bad[0]!r} ({type(bad[0]).__name__}); {expected}.")
        return [None if r is None else float(r) for r in rewards]

    return checked


# ---------------------------------------------------------------- registry

REWARD_FUNCS: dict[str, Callable[[str | None], RewardFunc]] = {
    "accuracy": accuracy_reward,
    "exact": exact_reward,
    "regex": regex_reward,
    "format": format_reward,
    "length": length_reward,
    "reward_model": reward_model_reward,
    "python": python_reward,
}


def _split_specs(names: str) -> list[str]:
    """Split "accuracy,format:<regex>" on commas, except the commas inside a regex (`\\d{1,3}`)."""
    specs: list[str] = []
    for piece in names.split(","):
        if specs and specs[-1].startswith(("format:", "regex:")) and piece.split(":", 1)[0].strip() not in REWARD_FUNCS:
            specs[-1] += "," + piece
        else:
            specs.append(piece.strip())
    return [s for s in specs if s]


def _checked(names: str | list[str] | None, weights: list[float] | str | None) -> tuple[list[str], list[float]]:
    """The specs and their weights, checked without building anything (no model loads, no imports)."""
    specs = _split_specs(names) if isinstance(names, str) else [str(n).strip() for n in names or []]
    if not specs:
        raise ConfigError(
            f"No reward functions: set reward_funcs, e.g. `reward_funcs: [accuracy, format]` "
            f"(known: {', '.join(REWARD_FUNCS)})."
        )
    if isinstance(weights, str):
        weights = [w for w in weights.split(",") if w.strip()]  # type: ignore[misc]
    if weights is None:
        weights = [1.0] * len(specs)
    if len(weights) != len(specs):
        raise ConfigError(
            f"reward_weights has {len(weights)} values but reward_funcs has {len(specs)} ({', '.join(specs)}); "
            "give one weight per reward function, or leave reward_weights out for all 1.0."
        )
    try:
        numbers = [float(w) for w in weights]
    except (TypeError, ValueError):
        raise ConfigError(f"reward_weights must be numbers, got {weights!r}.") from None
    for spec in specs:
        name = spec.partition(":")[0].strip()
        if name not in REWARD_FUNCS:
            raise ConfigError(f"Unknown reward function '{name}'.{did_you_mean(name, REWARD_FUNCS)} "
                              f"Known: {', '.join(REWARD_FUNCS)}.")
    return specs, numbers


def get_reward_funcs(
    names: str | list[str] | None, weights: list[float] | None = None
) -> tuple[list[RewardFunc], list[float]]:
    """Reward callables for `reward_funcs` (a list, or a comma-separated string) and their weights."""
    specs, numbers = _checked(names, weights)
    funcs: list[RewardFunc] = []
    seen: dict[str, int] = {}
    for spec in specs:
        name, colon, arg = spec.partition(":")
        fn = REWARD_FUNCS[name.strip()](arg if colon else None)
        # TRL logs each reward under fn.__name__; two entries with one name would merge in the logs.
        seen[fn.__name__] = seen.get(fn.__name__, 0) + 1
        if seen[fn.__name__] > 1:
            fn.__name__ = f"{fn.__name__}_{seen[fn.__name__]}"
        funcs.append(fn)
    return funcs, numbers


def combined_reward(
    funcs: list[RewardFunc], weights: list[float], prompts: list[Any], completions: list[Any], **columns: Any
) -> list[float]:
    """The weighted sum of all rewards per completion; None (and NaN) count as 0."""
    if len(funcs) != len(weights):
        raise ConfigError(f"{len(funcs)} reward functions but {len(weights)} weights.")
    totals = [0.0] * len(completions)
    for fn, weight in zip(funcs, weights):
        for i, reward in enumerate(fn(prompts=prompts, completions=completions, **columns)):
            if reward is not None and not math.isnan(reward):
                totals[i] += weight * reward
    return totals


# ---------------------------------------------------------------- the config keys every online stage shares

@dataclass
class RewardChoice:
    """Where rewards come from (grpo, gspo, rloo, ppo): named reward functions and/or a trained reward model."""

    reward_funcs: list[str] | None = field(
        default=None,
        metadata={"help": "Reward functions: accuracy, format, length, reward_model:<path>, python:module:function."},
    )
    reward_weights: list[float] | None = field(
        default=None, metadata={"help": "One weight per reward function (default: all 1)."}
    )
    reward_model: str | None = field(
        default=None, metadata={"help": "Output folder of a `stage: rm` run, used as one more reward."}
    )

    def requested(self) -> tuple[list[str], list[float] | None]:
        """The reward specs and weights asked for; `reward_model` weighs 1 unless weighted."""
        names = list(self.reward_funcs or [])
        weights = list(self.reward_weights) if self.reward_weights is not None else None
        if self.reward_model:
            names.append(f"reward_model:{self.reward_model}")
            if weights is not None and len(weights) == len(names) - 1:
                weights.append(1.0)
        if not names:
            raise IncompleteConfig("This stage needs rewards: set `reward_funcs` (e.g. [accuracy, format]) and/or "
                              "`reward_model` (the output folder of a `stage: rm` run).")
        return names, weights

    def validate(self, args: TrainArgs[Any]) -> None:
        _checked(*self.requested())


def rewards_of(choice: RewardChoice) -> tuple[list[RewardFunc], list[float]]:
    """The reward callables and weights a stage's options ask for."""
    return get_reward_funcs(*choice.requested())
