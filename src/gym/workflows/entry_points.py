"""LLaMA-Factory's Python entry points, one per stage, on Gym's run:

    from gym.hparams import get_train_args
    from gym.train import run_sft

    model_args, data_args, training_args, finetuning_args, generating_args = get_train_args(config)
    run_sft(model_args, data_args, training_args, finetuning_args, generating_args)

Each `run_<stage>` is `gym train` with `stage: <stage>` (the same output folder, checks and result), and
takes LLaMA-Factory's orders of arguments: (model, data, training, finetuning, generating[, callbacks]),
and for pt/rm/dpo/kto also (model, data, training, finetuning[, callbacks]).

LLaMA-Factory keeps every stage's options in its FinetuningArguments; Gym keeps them apart (TrainArgs.options). The
adaptation lives here alone: `as_llamafactory` returns the five objects with the options carried by a
`LlamaFactoryFinetuning`, and `run_<stage>` takes them back out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gym.config.args import TrainArgs
from gym.config.data import DataArguments
from gym.config.finetuning import FinetuningArguments
from gym.config.generating import GeneratingArguments
from gym.config.model import ModelArguments
from gym.config.stages.registry import get_stage
from gym.config.training import TrainingArguments
from gym.core.errors import ConfigError
from gym.core.results import RunResult
from gym.train.harness import extra_callbacks
from gym.workflows.training import run_exp

Runner = Callable[..., RunResult]
LlamaFactoryArgs = tuple[ModelArguments, DataArguments, TrainingArguments, FinetuningArguments, GeneratingArguments]


@dataclass
class LlamaFactoryFinetuning(FinetuningArguments):
    """FinetuningArguments that also carry the stage's options, as LLaMA-Factory's do."""

    stage_options: Any = field(default=None, repr=False, compare=False)


def as_llamafactory(args: TrainArgs[Any]) -> LlamaFactoryArgs:
    """A parsed config as LLaMA-Factory's get_train_args returns it: (model, data, training, finetuning, generating)."""
    finetuning = LlamaFactoryFinetuning(**_init_values(args.finetuning), stage_options=args.options)
    return args.model, args.data, args.training, finetuning, args.generating


def _init_values(part: Any) -> dict[str, Any]:
    return {f.name: getattr(part, f.name) for f in dataclasses.fields(part) if f.init}


def _options(finetuning: FinetuningArguments) -> Any:
    if isinstance(finetuning, LlamaFactoryFinetuning):
        return finetuning.stage_options
    stage = get_stage(finetuning.stage)  # built by hand: the stage's defaults
    return stage.options(**stage.fixed) if stage.options is not None else None


def _runner(stage: str) -> Runner:
    def run(model_args: ModelArguments, data_args: DataArguments, training_args: TrainingArguments,
            finetuning_args: FinetuningArguments, generating_args: GeneratingArguments | list[Any] | None = None,
            callbacks: list[Any] | None = None) -> RunResult:
        if isinstance(generating_args, list):  # run_dpo(model, data, training, finetuning, callbacks)
            generating_args, callbacks = None, generating_args
        if finetuning_args.stage != stage:
            raise ConfigError(f"run_{stage} was given the arguments of a 'stage: {finetuning_args.stage}' config: set "
                              f"stage: {stage} in the config passed to get_train_args, or call "
                              f"run_{finetuning_args.stage}.")
        finetuning = FinetuningArguments(**{k: v for k, v in _init_values(finetuning_args).items()
                                            if k != "stage_options"})
        args = TrainArgs(model_args, data_args, training_args, finetuning, generating_args or GeneratingArguments(),
                         _options(finetuning_args))
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
run_cls = _runner("cls")
