"""`run_exp`: the one entry point behind `gym train`, the Python API and the web UI.

config -> the stage's method (from the registry) -> its run -> (optionally) the result as a delta.

Around the run, the output folder's guarantees (docs/reliability.md): one live run owns it (a second
one fails at once, naming the first); what a killed run left (temporary files, half-written
checkpoints) is removed first; resuming a finished run reports it and trains nothing; running out of
disk removes the partial checkpoint and ends with one line saying how much space is free.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import shutil
from pathlib import Path
from typing import Any

from gym.config.args import TrainArgs
from gym.config.files import ConfigSource
from gym.config.methods import get_method
from gym.config.parser import get_train_args
from gym.core.errors import OutputError
from gym.core.files import OutputLock, human_bytes, remove_stale_temps
from gym.core.results import RunResult
from gym.delta.from_training import compress_output
from gym.train.checkpoints import remove_incomplete_checkpoints, resume_requested
from gym.train.outputs import check_output_dir, completed_run
from gym.train.ranks import is_main_process

logger = logging.getLogger(__name__)

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def run_exp(config: ConfigSource | TrainArgs[Any] = None) -> RunResult:
    args = get_train_args(config)
    method = get_method(args.finetuning.stage)
    resuming = resume_requested(args)
    check_output_dir(args, resuming)
    main = is_main_process()  # in a distributed run, rank 0 owns the output folder; the others train beside it
    with OutputLock(args.output_dir, what="gym train") if main else contextlib.nullcontext():
        if main:
            _clean_after_dead_runs(args.output_dir)
        done = completed_run(args, resuming)
        if done is not None:
            logger.info("%s already holds the finished run; nothing to resume.", args.output_dir)
            return done
        try:
            result = method.run(args)
            if main and args.finetuning.delta_compression:
                result.metrics["delta_file"] = str(compress_output(args, result.output_dir))
            if main and args.finetuning.eval_tasks:
                result.metrics.update(_evaluate(args, result.output_dir))
        except OSError as exc:
            if exc.errno not in _NO_SPACE:
                raise
            raise _out_of_space(args.output_dir, exc) from None
    return result


def _evaluate(args: TrainArgs[Any], output_dir: str) -> dict[str, float]:
    from gym.eval.after_training import evaluate_after_training

    base = {"model_name_or_path": args.model.model_name_or_path, "template": args.data.template,
            "default_system": args.data.default_system, "enable_thinking": args.data.enable_thinking}
    return evaluate_after_training(list(args.finetuning.eval_tasks or []), output_dir, base,
                                   dataset_dir=args.data.dataset_dir, cutoff_len=args.data.cutoff_len,
                                   seed=args.training.seed)


def _clean_after_dead_runs(output_dir: str) -> None:
    removed = remove_stale_temps(output_dir) + remove_incomplete_checkpoints(output_dir)
    if removed:
        logger.warning("Removed what an interrupted run left in %s: %s", output_dir,
                       ", ".join(p.name for p in removed))


def _out_of_space(output_dir: str, exc: OSError) -> OutputError:
    """Free what the failed write took (the half-written checkpoint or final folder), then say where."""
    for path in [*remove_incomplete_checkpoints(output_dir), *Path(output_dir).glob(".*.tmp-*")]:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    free = shutil.disk_usage(output_dir).free
    return OutputError(f"No space left on the device of {output_dir} (writing {exc.filename or 'the output'}); "
                       f"{human_bytes(free)} free after removing the partial write. Free some space, then resume "
                       "with resume_from_checkpoint: true.")
