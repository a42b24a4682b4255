"""`run_exp`: the one training entry point behind `gym train`, the Python API, the web UI, `gym tune` and
LLaMA-Factory's `run_<stage>`: train, then what the config asks for after training.

    config -> gym.train (the run, in output_dir) -> gym.delta (delta_compression: delta.safetensors beside it)
           -> gym.eval (eval_tasks: the results, and the base's, in the run folder)

The steps after training run on the main process only, under the run folder's lock, and not again when a finished
run is resumed.
"""

from __future__ import annotations

from typing import Any

from gym.config.args import TrainArgs
from gym.config.files import ConfigSource
from gym.config.parser import get_train_args
from gym.core.files import OutputLock
from gym.core.results import RunResult
from gym.train.ranks import is_main_process
from gym.train.run import out_of_space_reported, run_training


def run_exp(config: ConfigSource | TrainArgs[Any] = None) -> RunResult:
    args = get_train_args(config)
    if args.finetuning.eval_tasks:
        from gym.eval.config import check_tasks

        check_tasks(list(args.finetuning.eval_tasks), args.data.dataset_dir)
    result = run_training(args)
    if not is_main_process() or result.metrics.get("already_complete"):
        return result
    if args.finetuning.delta_compression or args.finetuning.eval_tasks:
        with OutputLock(result.output_dir, what="gym train"), out_of_space_reported(result.output_dir):
            if args.finetuning.delta_compression:
                from gym.delta.from_training import compress_output  # each step's job loads only when asked for

                result.metrics["delta_file"] = str(compress_output(args, result.output_dir))
            if args.finetuning.eval_tasks:
                result.scores = _evaluate(args, result.output_dir)
                result.metrics.update(result.scores)
    return result


def _evaluate(args: TrainArgs[Any], output_dir: str) -> dict[str, float]:
    from gym.eval.after_training import evaluate_after_training

    base = {"model_name_or_path": args.model.model_name_or_path, "template": args.data.template,
            "default_system": args.data.default_system, "enable_thinking": args.data.enable_thinking}
    return evaluate_after_training(list(args.finetuning.eval_tasks or []), output_dir, base,
                                   dataset_dir=args.data.dataset_dir, cutoff_len=args.data.cutoff_len,
                                   seed=args.training.seed)
