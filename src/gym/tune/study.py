"""`gym tune CONFIG --trials N`: hyper-parameter search with Optuna over the config's `tune:` section.

Each trial is a normal `gym train` run (run_exp) with the sampled values, in its own folder
output_dir/trial-<n>. The study lives in output_dir/tune.db (SQLite), so an interrupted search resumes where it
stopped: finished trials are kept, the one that was running is marked failed and run again under a new number.
Trials are pruned on their intermediate eval loss (Optuna's median rule: a trial whose eval loss at a step is
worse than the median of earlier trials at that step stops). At the end: a results table (tune_results.md) and
the best trial's config as a runnable YAML (best.yaml).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from transformers import TrainerCallback

from gym.config.files import Config
from gym.config.parser import default_output_dir, get_train_args
from gym.core.errors import ConfigError
from gym.core.files import make_folder, temp_path
from gym.core.names import did_you_mean
from gym.train import harness
from gym.tune.metrics import trial_metrics
from gym.tune.space import Dimension, describe, parse_space
from gym.workflows.training import run_exp

logger = logging.getLogger(__name__)

STUDY_NAME = "gym-tune"


@dataclass
class TuneResult:
    output_dir: Path
    best_value: float
    best_params: dict[str, Any]
    best_config: Path
    table: Path
    completed: int
    pruned: int


class _ReportEvalLoss(TrainerCallback):
    """Hands each evaluation's metric to the trial, and stops the trial when Optuna prunes it."""

    def __init__(self, trial: Any, metric: str, confirm: bool = False) -> None:
        self.trial = trial
        self.metric = metric
        self.confirm = confirm  # a stage's own eval_ metric, not known from the config: the first evaluation tells

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict[str, float] | None = None,
                    **kwargs: Any) -> None:
        import optuna

        if metrics and self.confirm and self.metric not in metrics:
            raise ConfigError(f"--metric {self.metric}: the trial's evaluation reports "
                              f"{', '.join(sorted(metrics))}, not it.{did_you_mean(self.metric, metrics)}")
        self.confirm = False
        if metrics and self.metric in metrics:
            self.trial.report(float(metrics[self.metric]), state.global_step)
            if self.trial.should_prune():
                raise optuna.TrialPruned(f"{self.metric} {metrics[self.metric]:.4f} at step {state.global_step}")


def _metric_value(result: Any, metric: str) -> float:
    if metric in ("loss", "train_loss") and result.final_loss is not None:
        return float(result.final_loss)
    if metric in result.metrics:
        return float(result.metrics[metric])
    raise ConfigError(f"The trial finished without the metric '{metric}' (it has: "
                      f"{', '.join(sorted(result.metrics))}); choose one of them with --metric.")


def tune(config: Config, trials: int, metric: str = "eval_loss", direction: str = "minimize") -> TuneResult:
    """Run (or resume) the search until `trials` trials have finished (completed or pruned)."""
    import optuna

    config = dict(config)
    if "tune" not in config:
        raise ConfigError("gym tune needs a 'tune:' section naming the keys to search, e.g. "
                          "tune: {learning_rate: {low: 1.0e-5, high: 1.0e-3, log: true}}.")
    space = parse_space(config.pop("tune"))
    if trials < 1:
        raise ConfigError(f"--trials must be at least 1, got {trials}.")
    if direction not in ("minimize", "maximize"):
        raise ConfigError(f"--direction is minimize or maximize, got {direction!r}.")
    base = get_train_args(_with_values(config, space, _middle))  # a bad base config fails before any trial
    confirm = trial_metrics(base).check(metric)  # so does a metric no trial reports
    out = Path(config.get("output_dir") or default_output_dir(base.model, base.finetuning) + "-tune")
    make_folder(out)  # a file in the way is one line, not a traceback

    from sqlalchemy.exc import SQLAlchemyError  # optuna's storage layer

    try:
        study = optuna.create_study(
            study_name=STUDY_NAME, storage=f"sqlite:///{out / 'tune.db'}", load_if_exists=True,
            direction="maximize" if direction == "maximize" else "minimize",
            sampler=optuna.samplers.TPESampler(seed=base.training.seed),
            pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0),
        )
    except SQLAlchemyError as exc:  # a tune.db that is no SQLite file, or a folder of that name
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        raise ConfigError(f"{out / 'tune.db'} cannot be opened as a gym tune study ({reason}): move it away to "
                          "start a new search there, or choose another output_dir.") from None
    _check_resumed(study, out, space, metric, direction)
    for stale in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        study.tell(stale.number, state=optuna.trial.TrialState.FAIL)  # killed with the last run: run it again
    finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    diverged: list[str] = []  # this call's trials whose metric was NaN or inf
    while len(study.get_trials(deepcopy=False, states=finished)) < trials:
        if len(diverged) >= trials:
            # Each such trial is run again under a new number; a space where every setting diverges would run
            # trials forever.
            _write(out / "tune_results.md", _table(study, space, metric))
            raise ConfigError(f"{len(diverged)} trials in a row ended with a non-finite {metric} "
                              f"({'; '.join(diverged[:3])}): the search space reaches settings that diverge. "
                              f"Narrow it (a lower learning_rate, say) and run again; finished trials are kept "
                              f"({out / 'tune_results.md'}).")
        trial = study.ask()
        values = {d.key: d.suggest(trial) for d in space}
        # transformers logs a NaN or inf loss as the mean of the finite ones in its window, 0 when there are none:
        # a diverged trial would read as the best. The trial's own config only; best.yaml is the user's.
        trial_config = {**config, **values, "output_dir": str(out / f"trial-{trial.number}"),
                        "logging_nan_inf_filter": False}
        logger.info("Trial %d: %s", trial.number, ", ".join(f"{k}={v}" for k, v in values.items()))
        try:
            with harness.extra_callbacks(_ReportEvalLoss(trial, metric, confirm)):
                result = run_exp(trial_config)
        except optuna.TrialPruned as pruned:
            logger.info("Trial %d pruned: %s", trial.number, pruned)
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            diverged.clear()
            continue
        except BaseException:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            raise
        value = _metric_value(result, metric)
        if not math.isfinite(value):
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            diverged.append(f"trial {trial.number}: {value} with " + ", ".join(f"{k}={v}" for k, v in values.items()))
            continue
        diverged.clear()
        study.tell(trial, value)
        logger.info("Trial %d: %s = %.4f", trial.number, metric, value)

    best = study.best_trial
    best_config = {**config, **best.params, "output_dir": str(out / "best")}
    best_path = _write(out / "best.yaml", yaml.safe_dump(best_config, sort_keys=False))
    table = _write(out / "tune_results.md", _table(study, space, metric))
    counts = {s: len(study.get_trials(deepcopy=False, states=(s,))) for s in finished}
    assert best.value is not None  # a completed trial has its value
    return TuneResult(out, float(best.value), dict(best.params), best_path, table,
                      counts[optuna.trial.TrialState.COMPLETE], counts[optuna.trial.TrialState.PRUNED])


def _check_resumed(study: Any, out: Path, space: list[Dimension], metric: str, direction: str) -> None:
    """A study resumed from tune.db must be the same search: Optuna keeps the direction it was created with, and
    compares values across trials whatever metric each was judged by, so a changed --direction or --metric would
    silently pick the wrong best trial; a key sampled from another kind of range (or other choices) is refused by
    Optuna only mid-trial, with a traceback."""
    from optuna.distributions import check_distribution_compatibility

    db = out / "tune.db"
    recorded = study.direction.name.lower()
    if recorded != direction:
        raise ConfigError(f"{db} is a search that {recorded}s {study.user_attrs.get('metric', 'its metric')}: run it "
                          f"with --direction {recorded}, or search with --direction {direction} in another output_dir.")
    previous = study.user_attrs.get("metric")
    if previous is not None and previous != metric:
        raise ConfigError(f"{db} is a search on --metric {previous}: run it with --metric {previous}, or search on "
                          f"{metric} in another output_dir.")
    for trial in study.get_trials(deepcopy=False):
        for dimension in space:
            old = trial.distributions.get(dimension.key)
            if old is None:
                continue
            new = dimension.distribution()
            try:
                check_distribution_compatibility(old, new)
            except ValueError:
                raise ConfigError(f"tune: '{dimension.key}' is searched in {db} as {describe(old)}, now as "
                                  f"{describe(new)}; a resumed search keeps the kind of each range and the list "
                                  "of choices (a range's ends may change). Restore it, or search in another "
                                  "output_dir.") from None
    if previous is None:
        study.set_user_attr("metric", metric)


def _middle(dimension: Dimension) -> Any:
    if dimension.choices is not None:
        return dimension.choices[0]
    assert dimension.low is not None and dimension.high is not None
    value = math.sqrt(dimension.low * dimension.high) if dimension.log else (dimension.low + dimension.high) / 2
    return int(value) if dimension.is_int else value


def _with_values(config: Config, space: list[Dimension], pick: Any) -> Config:
    return {**config, **{d.key: pick(d) for d in space}}


def _table(study: Any, space: list[Dimension], metric: str) -> str:
    keys = [d.key for d in space]
    lines = [f"| trial | state | {metric} | " + " | ".join(keys) + " |", "|---" * (len(keys) + 3) + "|"]
    for trial in study.get_trials(deepcopy=False):
        value = "" if trial.value is None else f"{trial.value:.4f}"
        params = " | ".join(str(trial.params.get(k, "")) for k in keys)
        lines.append(f"| {trial.number} | {trial.state.name.lower()} | {value} | {params} |")
    return "\n".join(lines) + "\n"


def _write(path: Path, text: str) -> Path:
    tmp = temp_path(path)
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path
