"""`reward_funcs`, `reward_weights` and `reward_model`: where the online stages (grpo, gspo, rloo, ppo) get rewards.

The specs are checked here, by name and shape, without building anything: the reward functions themselves live in
gym.rewards (above this layer), which builds one for each name in REWARD_NAMES.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gym.core.errors import ConfigError, IncompleteConfig
from gym.core.names import did_you_mean

if TYPE_CHECKING:
    from gym.config.args import TrainArgs

# Each spec is `name` or `name:argument`; gym.rewards.functions.REWARD_FUNCS builds each of these (a test checks).
REWARD_NAMES = ("accuracy", "exact", "regex", "format", "length", "reward_model", "python")


def split_specs(names: str) -> list[str]:
    """Split "accuracy,format:<regex>" on commas, except the commas inside a regex (`\\d{1,3}`)."""
    specs: list[str] = []
    for piece in names.split(","):
        if specs and specs[-1].startswith(("format:", "regex:")) and piece.split(":", 1)[0].strip() not in REWARD_NAMES:
            specs[-1] += "," + piece
        else:
            specs.append(piece.strip())
    return [s for s in specs if s]


def check_reward_specs(names: str | list[str] | None, weights: list[float] | str | None
                       ) -> tuple[list[str], list[float]]:
    """The specs and their weights, checked without building anything (no model loads, no imports)."""
    specs = split_specs(names) if isinstance(names, str) else [str(n).strip() for n in names or []]
    if not specs:
        raise ConfigError(f"No reward functions: set reward_funcs, e.g. `reward_funcs: [accuracy, format]` "
                          f"(known: {', '.join(REWARD_NAMES)}).")
    if isinstance(weights, str):
        weights = [w for w in weights.split(",") if w.strip()]  # type: ignore[misc]
    if weights is None:
        weights = [1.0] * len(specs)
    if len(weights) != len(specs):
        raise ConfigError(f"reward_weights has {len(weights)} values but reward_funcs has {len(specs)} "
                          f"({', '.join(specs)}); give one weight per reward function, or leave reward_weights out "
                          "for all 1.0.")
    try:
        numbers = [float(w) for w in weights]
    except (TypeError, ValueError):
        raise ConfigError(f"reward_weights must be numbers, got {weights!r}.") from None
    for spec in specs:
        name = spec.partition(":")[0].strip()
        if name not in REWARD_NAMES:
            raise ConfigError(f"Unknown reward function '{name}'.{did_you_mean(name, REWARD_NAMES)} "
                              f"Known: {', '.join(REWARD_NAMES)}.")
    return specs, numbers


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
        check_reward_specs(*self.requested())
