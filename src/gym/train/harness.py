"""What every training method shares around its optimisation loop: the log file, the progress bar,
and the end of a run (save, plot, report).

TRL- and Trainer-based methods plug in through `HarnessCallback`; Gym's own loops (stage ppo) call
`RunLog`, `Progress` and `finish_run` directly (and reach the trackers of `report_to` through
`tracking.LoopReporter`). Either way a run leaves the same files and returns the same `RunResult`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm
from transformers import PrinterCallback, ProgressCallback, TrainerCallback

from gym.config.args import TrainArgs
from gym.core import heap
from gym.core.files import LOG_FILE, readable_as_umask
from gym.core.hardware import peak_memory_bytes
from gym.core.results import RunResult
from gym.train import outputs, ranks, sharding, tracking
from gym.train.outputs import read_log

logger = logging.getLogger(__name__)


class RunLog:
    """output_dir/trainer_log.jsonl, one JSON object per logged step. `start(step)` keeps only the lines up
    to `step` (a resumed run continues the log of the run it resumes; lines past the checkpoint, a line cut
    short by the interruption and a stopped run's closing summary belong to the run that ended)."""

    def __init__(self, output_dir: str | Path) -> None:
        self.path = Path(output_dir) / LOG_FILE
        self.started = time.time()

    def start(self, resume_step: int = 0) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if resume_step > 0 and self.path.is_file():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    entry = json.loads(line)
                    # A stopped run's closing summary (train_runtime ...) is not a step of the resumed run.
                    if entry.get("step", 0) <= resume_step and "train_runtime" not in entry:
                        kept.append(line)
                except json.JSONDecodeError:
                    break
        self.path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")

    def write(self, step: int, max_steps: int, values: dict[str, Any]) -> dict[str, Any]:
        entry = {"step": step, "max_steps": max_steps, **values, "elapsed_s": round(time.time() - self.started, 2)}
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry) + "\n")
        return entry


class Progress:
    """One bar for the whole run, its postfix showing the latest metrics; with the bar off, one log line
    per logged step instead."""

    def __init__(self, total: int, initial: int = 0, desc: str = "train", enabled: bool = True) -> None:
        self.bar = tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True) if enabled else None
        self.total = total

    def advance_to(self, step: int) -> None:
        if self.bar is not None:
            self.bar.update(step - self.bar.n)

    def show(self, step: int, metrics: dict[str, float]) -> None:
        if self.bar is not None:
            self.bar.set_postfix({k: f"{v:.4g}" for k, v in metrics.items()}, refresh=False)
        else:
            logger.info("step %d/%d: %s", step, self.total, ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()))

    def note(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text)
        else:
            logger.info(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


# What the progress bar shows from a log entry, when the entry has it.
SHOWN = ("loss", "reward", "kl", "tokens_per_second")


class HarnessCallback(TrainerCallback):
    """Connects a Hugging Face / TRL trainer to the run log and the progress bar."""

    def __init__(self, output_dir: str, show_bar: bool) -> None:
        self.log = RunLog(output_dir)
        self.show_bar = show_bar
        self.progress: Progress | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        heap.work_begins()  # a run of hours collects its garbage as CPython always does
        if state.is_world_process_zero:
            self.log.start(state.global_step)
            self.progress = Progress(state.max_steps, state.global_step, enabled=self.show_bar)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.progress is not None:
            self.progress.advance_to(state.global_step)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not state.is_world_process_zero or not logs:
            return
        self.log.write(state.global_step, state.max_steps, logs)
        if self.progress is None:
            return
        if "eval_loss" in logs:
            self.progress.note(f"step {state.global_step}: eval_loss {logs['eval_loss']:.4f}")
        shown = {k: float(logs[k]) for k in SHOWN if isinstance(logs.get(k), (int, float))}
        if shown:
            self.progress.show(state.global_step, shown)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # safetensors writes 0600: a checkpoint shared with another account (a resume by a service user) read in part
        checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if state.is_world_process_zero and checkpoint.is_dir():
            readable_as_umask(checkpoint)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.progress is not None:
            self.progress.close()
            self.progress = None


_EXTRA_CALLBACKS: ContextVar[tuple[TrainerCallback, ...]] = ContextVar("gym_extra_callbacks", default=())


@contextmanager
def extra_callbacks(*callbacks: TrainerCallback) -> Iterator[None]:
    """Runs started inside this block also call `callbacks` (gym tune's pruning reports its trials this way)."""
    token = _EXTRA_CALLBACKS.set(_EXTRA_CALLBACKS.get() + callbacks)
    try:
        yield
    finally:
        _EXTRA_CALLBACKS.reset(token)


def attach(trainer: Any, args: TrainArgs[Any], model_path: str) -> None:
    """Replace the trainer's own progress printing with the harness (bar or log lines, and the log file), and give
    the trackers of `report_to` Gym's config."""
    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(HarnessCallback(args.output_dir, show_bar=not args.training.disable_tqdm))
    tracking.attach(trainer, args, model_path)
    for callback in _EXTRA_CALLBACKS.get():
        trainer.add_callback(callback)


def finish_run(model: Any, tokenizer: Any, args: TrainArgs[Any], *, model_path: str, global_step: int,
               seconds: float, tokens_seen: int, tokens_per_second: float, final_loss: float | None,
               metrics: dict[str, Any], pissa_init_dir: str | None = None,
               extra: outputs.ExtraFiles | None = None) -> RunResult:
    """Save the final model (temp + rename), plot the curves if asked, and report. In a distributed run only rank 0
    writes (under DDP every rank holds the same weights; under FSDP they are gathered onto it first); the others
    wait until it has."""
    out = Path(args.output_dir)
    gathered = sharding.full_state_dict(model)  # collective under FSDP: every rank takes part
    if ranks.is_main_process():
        out = outputs.save_final(model, tokenizer, args, model_path, global_step, pissa_init_dir, extra=extra,
                                 state_dict=gathered)
        if args.finetuning.plot_loss:
            outputs.plot_loss(out, read_log(out))
    ranks.wait_for_everyone()
    return RunResult(output_dir=str(out), global_step=global_step, final_loss=final_loss,
                     tokens_per_second=tokens_per_second, peak_memory_bytes=peak_memory_bytes(),
                     train_seconds=seconds, tokens_seen=tokens_seen, metrics=metrics)
