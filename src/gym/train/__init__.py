"""The training job: the methods (methods/), the path they share (workflow), the harness, outputs and checkpoints.

This package's own module is also a door, for LLaMA-Factory's spelling: `from gym.train import run_sft` (and run_pt,
run_dpo, ... one per stage) and `run_exp` load gym.workflows on first use. tests/test_layers.py counts this one
module (the facade) among the doors; every other module of the package is the job.
"""

from __future__ import annotations

from typing import Any

_ENTRY_POINTS = ("run_pt", "run_sft", "run_rm", "run_ppo", "run_dpo", "run_kto", "run_orpo", "run_simpo", "run_cpo",
                 "run_tdpo", "run_grpo", "run_gspo", "run_rloo", "run_unlearn", "run_cls")

__all__ = [*_ENTRY_POINTS, "run_exp"]


def __getattr__(name: str) -> Any:
    if name in _ENTRY_POINTS:
        from gym.workflows import entry_points

        return getattr(entry_points, name)
    if name == "run_exp":
        from gym.workflows.training import run_exp

        return run_exp
    raise AttributeError(f"module 'gym.train' has no attribute {name!r}")
