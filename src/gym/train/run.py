"""`run_training`: the training job. A validated config -> the stage's trainer module (named by the stage registry)
-> its run -> the result in output_dir. What follows training (a compressed delta, evaluation) is composed one level
up, in gym.workflows.training, which every door calls.

Around the run, the output folder's guarantees (docs/reliability.md): one live run owns it (a second
one fails at once, naming the first); what a killed run left (temporary files, half-written
checkpoints) is removed first; resuming a finished run reports it and trains nothing; running out of
disk removes the partial checkpoint and ends with one line saying how much space is free. While it trains, the
memory a step frees stays in the process for the next step (gym.core.allocator).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gym.config.args import TrainArgs
from gym.config.files import ConfigSource
from gym.config.parser import get_train_args
from gym.config.stages.registry import get_stage
from gym.core.allocator import freed_memory_kept
from gym.core.errors import ConfigError, OutputError, is_out_of_space
from gym.core.files import OutputLock, human_bytes, remove_stale_temps
from gym.core.results import RunResult
from gym.train.checkpoints import remove_incomplete_checkpoints, resume_requested
from gym.train.installing import check_output_dir, start_over
from gym.train.outputs import completed_run
from gym.train.ranks import is_main_process

logger = logging.getLogger(__name__)

_NEARLY_FULL = 64 * 2**20


def run_training(config: ConfigSource | TrainArgs[Any] = None) -> RunResult:
    """Train one run. A run already finished (and asked to resume) is reported with metrics["already_complete"]."""
    args = get_train_args(config)
    resuming = resume_requested(args)
    # The output folder is checked and locked before the stage's trainer is imported (transformers' Trainer and
    # peft, ~5 s on 2 cores): an output_dir that cannot be used, or a finished run resumed, is said at once.
    check_output_dir(args, resuming)
    main = is_main_process()  # in a distributed run, rank 0 owns the output folder; the others train beside it
    with OutputLock(args.output_dir, what="gym train") if main else contextlib.nullcontext():
        if main:
            _clean_after_dead_runs(args.output_dir)
            if args.finetuning.overwrite_output_dir and not resuming:
                removed = start_over(args.output_dir)
                if removed:
                    logger.info("overwrite_output_dir: starting again in %s (removed %s)", args.output_dir,
                                ", ".join(removed))
        done = completed_run(args, resuming)
        if done is not None:
            logger.info("%s already holds the finished run; nothing to resume.", args.output_dir)
            return done
        trainer = importlib.import_module(get_stage(args.finetuning.stage).trainer)
        with out_of_space_reported(args.output_dir), tracker_login_reported(), freed_memory_kept():
            result: RunResult = trainer.run(args)
    return result


@contextlib.contextmanager
def out_of_space_reported(output_dir: str) -> Iterator[None]:
    """Running out of disk while writing into output_dir: remove the partial write, then one line saying so."""
    try:
        yield
    except Exception as exc:
        if not (is_out_of_space(exc) or _torch_write_failed_on_a_full_disk(exc, output_dir)):
            raise
        raise _out_of_space(output_dir, exc) from None


@contextlib.contextmanager
def tracker_login_reported() -> Iterator[None]:
    """`report_to: wandb` with no W&B login and no terminal to ask for one: wandb raises inside the Trainer's first
    callback, after the model has loaded; one line saying what to do instead of its traceback. Told by the
    exception's module, so wandb is not imported for runs that do not use it."""
    try:
        yield
    except Exception as exc:
        kind = type(exc)
        if not (kind.__module__.startswith("wandb.") and kind.__name__ in ("UsageError", "AuthenticationError")):
            raise
        raise ConfigError(f"'report_to: wandb' could not log in to W&B ({exc}). Run `wandb login` or set "
                          "WANDB_API_KEY; or set WANDB_MODE=offline to write the run locally for `wandb sync` later; "
                          "or take wandb out of report_to.") from None


def _torch_write_failed_on_a_full_disk(exc: Exception, output_dir: str) -> bool:
    """torch.save's writer reports a full disk as "file write failed", without the system's error; told apart from
    other write failures by the space left once it failed."""
    return "file write failed" in str(exc) and shutil.disk_usage(output_dir).free < _NEARLY_FULL


def _clean_after_dead_runs(output_dir: str) -> None:
    removed = remove_stale_temps(output_dir) + remove_incomplete_checkpoints(output_dir)
    if removed:
        logger.warning("Removed what an interrupted run left in %s: %s", output_dir,
                       ", ".join(p.name for p in removed))


def _out_of_space(output_dir: str, exc: Exception) -> OutputError:
    """Free what the failed write took (the half-written checkpoint or final folder), then say where."""
    for path in [*remove_incomplete_checkpoints(output_dir), *Path(output_dir).glob(".*.tmp-*")]:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    free = shutil.disk_usage(output_dir).free
    writing = getattr(exc, "filename", None) or "the output"
    return OutputError(f"No space left on the device of {output_dir} (writing {writing}); "
                       f"{human_bytes(free)} free after removing the partial write. Free some space, then resume "
                       "with resume_from_checkpoint: true.")
