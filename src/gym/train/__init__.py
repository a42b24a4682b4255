"""Training: the methods (methods/), the path they share (workflow), the harness, outputs and checkpoints.

`from gym.train import run_sft` (and run_pt, run_dpo, ... one per stage; gym.train.entry_points) and
`run_exp` are LLaMA-Factory's Python entry points; they load on first use.
"""

from __future__ import annotations

from typing import Any

_ENTRY_POINTS = ("run_pt", "run_sft", "run_rm", "run_ppo", "run_dpo", "run_kto", "run_orpo", "run_simpo", "run_cpo",
                 "run_tdpo", "run_grpo", "run_gspo", "run_rloo", "run_unlearn")

__all__ = [*_ENTRY_POINTS, "run_exp"]


def __getattr__(name: str) -> Any:
    import importlib

    if name in _ENTRY_POINTS:
        return getattr(importlib.import_module("gym.train.entry_points"), name)
    if name == "run_exp":
        return importlib.import_module("gym.train.run").run_exp
    raise AttributeError(f"module 'gym.train' has no attribute {name!r}")
