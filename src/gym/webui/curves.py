"""The Train tab's live curves and progress, read from each run's `trainer_log.jsonl` (the file every stage
writes through gym.train.harness), so a page opened mid-run, or long after, draws the same chart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gym.train.outputs import read_log

# chart -> the log keys it draws, first found wins (TRL and Gym's own PPO loop name some differently)
CHARTS: dict[str, tuple[str, ...]] = {
    "loss": ("loss",),
    "learning_rate": ("learning_rate",),
    "reward": ("reward", "rewards/chosen"),
    "kl": ("kl", "objective/kl"),
    "completion_length": ("completions/mean_length", "response_length", "completion_length"),
    "eval_loss": ("eval_loss",),
}


def points(output_dirs: dict[str, str], chart: str) -> list[dict[str, Any]]:
    """Long-format rows {step, value, run} of one chart for several runs (run label -> output_dir)."""
    keys = CHARTS[chart]
    rows: list[dict[str, Any]] = []
    for run, output_dir in output_dirs.items():
        for entry in read_log(output_dir):
            key = next((k for k in keys if isinstance(entry.get(k), (int, float))), None)
            if key is not None and "step" in entry:
                rows.append({"step": int(entry["step"]), "value": float(entry[key]), "run": run})
    return rows


def charts_with_data(output_dirs: dict[str, str]) -> list[str]:
    return [chart for chart in CHARTS if points(output_dirs, chart)]


def progress(output_dir: str | Path | None) -> tuple[int, int]:
    """(last logged step, max_steps) of a run; (0, 0) before its first log line."""
    if output_dir is None:
        return 0, 0
    log = read_log(output_dir)
    steps = [e for e in log if "step" in e]
    if not steps:
        return 0, 0
    return int(steps[-1]["step"]), int(steps[-1].get("max_steps", 0))
