"""Reward functions for the online RL stages (grpo, gspo, rloo, ppo), chosen by name in the config.

    reward_funcs: [accuracy, format]        # or "accuracy,format"
    reward_weights: [1.0, 0.5]              # optional, all 1.0 by default

Every entry is `name` or `name:argument` (`length:80`, `format:<regex>`, `regex:<pattern>`, `reward_model:saves/rm`,
`python:my_rewards:score`). Each resolves to a callable with TRL's reward signature,
`fn(prompts, completions, **columns) -> list[float | None]`, so the same list feeds TRL's trainers
and our own PPO loop (through `combined_reward`). A None reward means "not applicable to this row".

To add a reward: write a factory `name_reward(arg: str | None) -> RewardFunc` (in gym.rewards.verifiers
for a rule on the text), add it to REWARD_FUNCS below and its name to gym.config.rewards.REWARD_NAMES.
Users can also bring their own without touching Gym: `python:my_module:my_function`.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gym.config.rewards import RewardChoice, check_reward_specs
from gym.core.errors import ConfigError, GymError
from gym.rewards.reward_model import load_reward_model, reward_model_reward
from gym.rewards.verifiers import (
    RewardFunc,
    accuracy_reward,
    exact_reward,
    format_reward,
    length_reward,
    regex_reward,
)

__all__ = ["REWARD_FUNCS", "RewardFunc", "combined_reward", "get_reward_funcs", "load_reward_model", "rewards_of"]


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

# One factory per name the config layer accepts (gym.config.rewards.REWARD_NAMES).
REWARD_FUNCS: dict[str, Callable[[str | None], RewardFunc]] = {
    "accuracy": accuracy_reward,
    "exact": exact_reward,
    "regex": regex_reward,
    "format": format_reward,
    "length": length_reward,
    "reward_model": reward_model_reward,
    "python": python_reward,
}


def get_reward_funcs(
    names: str | list[str] | None, weights: list[float] | None = None
) -> tuple[list[RewardFunc], list[float]]:
    """Reward callables for `reward_funcs` (a list, or a comma-separated string) and their weights."""
    specs, numbers = check_reward_specs(names, weights)
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


def rewards_of(choice: RewardChoice) -> tuple[list[RewardFunc], list[float]]:
    """The reward callables and weights a stage's options ask for."""
    return get_reward_funcs(*choice.requested())
