"""LLaMA-Factory's Python entry points, one per stage, on Gym's run:

    from gym.hparams import get_train_args
    from gym.train import run_sft

    model_args, data_args, training_args, finetuning_args, generating_args = get_train_args(config)
    run_sft(model_args, data_args, training_args, finetuning_args, generating_args)

Each `run_<stage>` is `gym train` with `stage: <stage>` (the same output folder, checks and result), and
takes LLaMA-Factory's orders of arguments: (model, data, training, finetuning, generating[, callbacks]),
and for pt/rm/dpo/kto also (model, data, training, finetuning[, callbacks]).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gym.config.args import TrainArgs
from gym.config.data import DataArguments
from gym.config.finetuning import FinetuningArguments
from gym.config.generating import GeneratingArguments
from gym.config.model import ModelArguments
from gym.config.training import TrainingArguments
from gym.core.errors import ConfigError
from gym.core.results import RunResult

Runner = Callable[..., RunResult]


def _runner(stage: str) -> Runner:
    def run(model_args: ModelArguments, data_args: DataArguments, training_args: TrainingArguments,
            finetuning_args: FinetuningArguments, generating_args: GeneratingArguments | list[Any] | None = None,
            callbacks: list[Any] | None = None) -> RunResult:
        from gym.train.harness import extra_callbacks
        from gym.train.run import run_exp

        if isinstance(generating_args, list):  # run_dpo(model, data, training, finetuning, callbacks)
            generating_args, callbacks = None, generating_args
        if finetuning_args.stage != stage:
            raise ConfigError(f"run_{stage} was given the arguments of a 'stage: {finetuning_args.stage}' config: set "
                              f"stage: {stage} in the config passed to get_train_args, or call "
                              f"run_{finetuning_args.stage}.")
        args = TrainArgs(model_args, data_args, training_args, finetuning_args,
                         generating_args or GeneratingArguments(), finetuning_args.stage_options)
        with extra_callbacks(*(callbacks or [])):
            return run_exp(args)

    run.__name__ = run.__qualname__ = f"run_{stage}"
    run.__doc__ = f"Train with stage: {stage} from the five argument objects get_train_args returns."
    return run



run_pt = _runner("pt")
run_sft = _runner("sft")
run_rm = _runner("rm")
run_ppo = _runner("ppo")
run_dpo = _runner("dpo")
run_kto = _runner("kto")
run_orpo = _runner("orpo")
run_simpo = _runner("simpo")
run_cpo = _runner("cpo")
run_tdpo = _runner("tdpo")
run_grpo = _runner("grpo")
run_gspo = _runner("gspo")
run_rloo = _runner("rloo")
run_unlearn = _runner("unlearn")
