"""Which metric a `gym tune` trial can be judged by, known from the config before the first trial trains.

A trial is a training run, and its result holds: the trainer's train metrics (`loss`, `train_loss`,
`train_runtime`, ...); with evaluation data (val_size or eval_dataset) the evaluation's (`eval_loss`,
`eval_runtime`, ..., and a stage's own, such as DPO's `eval_rewards/accuracies`); with `eval_tasks` each task's
primary score (`eval_<task>_<metric>`, gym.eval.after_training). A --metric outside these is refused before the
first trial, rather than after a whole trial has trained for nothing (issue #39). A stage's own evaluation
metrics cannot be listed from the config: such a name is accepted when it is no near-miss of a known one, and
checked at the trial's first evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gym.config.args import TrainArgs
from gym.core.errors import ConfigError
from gym.core.names import closest, did_you_mean

TRAIN_METRICS = ("loss", "train_loss", "train_runtime", "train_samples_per_second", "train_steps_per_second",
                 "total_flos", "epoch")
EVAL_METRICS = ("eval_loss", "eval_runtime", "eval_samples_per_second", "eval_steps_per_second")


@dataclass(frozen=True)
class TrialMetrics:
    """The metric names a trial of one config reports."""

    names: tuple[str, ...]
    prefixes: tuple[str, ...] = ()  # lm-eval tasks' scores: eval_lm_eval_<task>_<what lm-eval reports>
    evaluates: bool = False  # evaluation data: a stage may add eval_ metrics of its own

    def check(self, metric: str) -> bool:
        """Raise a ConfigError when no trial can report `metric`; True when only the trial's first evaluation
        can tell (a stage's own eval_ metric)."""
        if metric in self.names or metric.startswith(self.prefixes):
            return False
        near = closest(metric, self.names)
        if metric in EVAL_METRICS or (metric.startswith("eval_") and near is None):
            if self.evaluates:
                return True  # a stage's own (a near miss of a known name is a typo, refused below)
            raise ConfigError(f"--metric {metric} needs evaluation data: set val_size (e.g. 0.1) or eval_dataset, "
                              "or tune on --metric loss (or on an eval_tasks score).")
        raise ConfigError(f"--metric {metric}: no trial of this config reports it."
                          f"{did_you_mean(metric, self.names)} It reports: {', '.join(self.names)}{self._more()}.")

    def _more(self) -> str:
        more = [f"{prefix}<metric>" for prefix in self.prefixes]
        if self.evaluates:
            more.append("the stage's own eval_ metrics")
        return f"; and {', '.join(more)}" if more else ""


def trial_metrics(args: TrainArgs[Any]) -> TrialMetrics:
    """What a trial of the (validated) config `args` reports."""
    names = list(TRAIN_METRICS)
    evaluates = bool(args.data.eval_dataset or args.data.val_size)
    if evaluates:
        names += EVAL_METRICS
    prefixes: list[str] = []
    if args.finetuning.eval_tasks:
        from gym.eval.after_training import reported_metrics

        task_names, prefixes = reported_metrics(list(args.finetuning.eval_tasks))
        names += task_names
    return TrialMetrics(tuple(names), tuple(prefixes), evaluates)
