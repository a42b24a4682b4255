"""Trainer callbacks: a progress bar with loss and tokens/s, and `trainer_log.jsonl`."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm
from transformers import TrainerCallback

LOG_FILE = "trainer_log.jsonl"


class ProgressBar(TrainerCallback):
    """One bar for the whole run; its postfix shows the latest loss and throughput."""

    def __init__(self) -> None:
        self.bar: tqdm | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            self.bar = tqdm(total=state.max_steps, initial=state.global_step, desc="train", dynamic_ncols=True)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if self.bar is not None and logs and "loss" in logs:
            postfix = {"loss": f"{logs['loss']:.4f}"}
            if "tokens_per_second" in logs:
                postfix["tok/s"] = f"{logs['tokens_per_second']:.0f}"
            self.bar.set_postfix(postfix, refresh=False)
        elif self.bar is not None and logs and "eval_loss" in logs:
            self.bar.write(f"step {state.global_step}: eval_loss {logs['eval_loss']:.4f}")

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class JsonlLogger(TrainerCallback):
    """Appends every log to output_dir/trainer_log.jsonl. On resume, drops lines past the checkpoint
    (they belong to the interrupted run), so the log reads as one run."""

    def __init__(self, output_dir: str) -> None:
        self.path = Path(output_dir) / LOG_FILE
        self.started = time.time()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if state.global_step > 0 and self.path.is_file():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    if json.loads(line).get("step", 0) <= state.global_step:
                        kept.append(line)
                except json.JSONDecodeError:
                    break  # a line cut short by the interruption, and everything after it
        self.path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if not state.is_world_process_zero or not logs:
            return
        entry = {"step": state.global_step, "max_steps": state.max_steps, **logs,
                 "elapsed_s": round(time.time() - self.started, 2)}
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry) + "\n")


def read_log(output_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(output_dir) / LOG_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
