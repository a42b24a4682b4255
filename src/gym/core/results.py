"""What a training run returns to its caller (the CLI prints it; the Python API hands it back)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunResult:
    output_dir: str
    global_step: int
    final_loss: float | None
    tokens_per_second: float
    peak_memory_bytes: int
    train_seconds: float
    tokens_seen: int = 0
    metrics: dict[str, Any] = field(default_factory=dict)
    scores: dict[str, float] = field(default_factory=dict)  # eval_tasks' primary scores (also in metrics)

    def summary(self) -> str:
        loss = f"{self.final_loss:.4f}" if self.final_loss is not None else "n/a"
        if self.final_loss is not None and not math.isfinite(self.final_loss):
            loss += " (the run diverged: lower learning_rate, or set max_grad_norm)"
        if self.metrics.get("already_complete"):
            return (f"Already complete: {self.output_dir} holds the finished run ({self.global_step} steps, final "
                    f"loss {loss}); nothing was trained. Raise max_steps to train further.")
        scores = ", ".join(f"{k} {v:.4g}" for k, v in self.scores.items())
        return (
            f"Done: {self.global_step} steps in {self.train_seconds:.0f} s, final loss {loss}, "
            f"{self.tokens_per_second:.0f} tokens/s, peak memory {self.peak_memory_bytes / 2**30:.2f} GiB.\n"
            + (f"Scores: {scores} (eval_results.json, eval_base.json).\n" if scores else "")
            + f"Saved to {self.output_dir}"
        )
