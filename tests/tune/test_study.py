"""gym tune: trials are real runs in their own folders, the search resumes from its SQLite study, pruned
trials are recorded as such, and the best config is written as a YAML that gym train runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gym.config.parser import get_train_args
from gym.core.errors import ConfigError
from gym.tune import study
from gym.tune.space import parse_space

pytest.importorskip("optuna", reason="gym tune needs Optuna: pip install 'zoo-gym[tune]' (part of the dev install)")

SPACE = {"learning_rate": {"low": "1e-4", "high": "1e-2", "log": True}, "lora_rank": [4, 8]}


@pytest.fixture()
def tune_config(train_config, tmp_path):
    return train_config(val_size=0.25, max_steps=2, output_dir=str(tmp_path / "search"), tune=SPACE)


def test_search_runs_trials_and_writes_the_best_config(tune_config, monkeypatch):
    runs: list[dict] = []
    real = study.run_exp
    monkeypatch.setattr(study, "run_exp", lambda config: runs.append(config) or real(config))
    result = study.tune(tune_config, trials=3)
    out = Path(tune_config["output_dir"])
    assert [Path(c["output_dir"]).name for c in runs] == ["trial-0", "trial-1", "trial-2"]
    # Trials run to the end unless Optuna's median rule prunes them on their eval loss (it may, here).
    assert result.completed + result.pruned == 3 and result.completed >= 2 and (out / "tune.db").is_file()
    rows = [line for line in result.table.read_text().splitlines() if line.startswith("| ") and "complete" in line]
    assert len(rows) == result.completed
    assert all((out / f"trial-{row.split('|')[1].strip()}" / "gym_manifest.json").is_file() for row in rows)
    assert round(result.best_value, 4) == min(float(row.split("|")[3]) for row in rows)
    assert all(1e-4 <= c["learning_rate"] <= 1e-2 and c["lora_rank"] in (4, 8) for c in runs)
    best = yaml.safe_load(result.best_config.read_text())
    assert "tune" not in best and best["learning_rate"] == result.best_params["learning_rate"]
    assert get_train_args(best).training.learning_rate == result.best_params["learning_rate"]  # gym train runs it

    # Resuming: asking for 4 trials runs only the one that is missing.
    runs.clear()
    again = study.tune(tune_config, trials=4)
    assert [Path(c["output_dir"]).name for c in runs] == ["trial-3"]
    assert again.completed + again.pruned == 4


def test_a_pruned_trial_is_recorded_and_the_search_goes_on(tune_config, monkeypatch):
    import optuna

    def prune_second(self, args, state, control, metrics=None, **kwargs):
        if self.trial.number == 1:
            raise optuna.TrialPruned("test")

    monkeypatch.setattr(study._ReportEvalLoss, "on_evaluate", prune_second)
    result = study.tune(tune_config, trials=3)
    assert result.pruned == 1 and result.completed == 2
    assert "| 1 | pruned |" in result.table.read_text()


def test_the_report_callback_prunes_when_optuna_says_so():
    import optuna

    class Trial:
        def __init__(self, prune: bool) -> None:
            self.reported: list[tuple[float, int]] = []
            self.prune = prune

        def report(self, value: float, step: int) -> None:
            self.reported.append((value, step))

        def should_prune(self) -> bool:
            return self.prune

    state = type("State", (), {"global_step": 7})()
    keep = Trial(prune=False)
    study._ReportEvalLoss(keep, "eval_loss").on_evaluate(None, state, None, metrics={"eval_loss": 1.5})
    assert keep.reported == [(1.5, 7)]
    with pytest.raises(optuna.TrialPruned):
        study._ReportEvalLoss(Trial(prune=True), "eval_loss").on_evaluate(None, state, None, metrics={"eval_loss": 9.0})


@pytest.mark.parametrize(("section", "message"), [
    ({"learning_rat": {"low": 1, "high": 2}}, "Did you mean 'learning_rate'"),
    ({"learning_rate": {"low": 2, "high": 1}}, "needs numbers low < high"),
    ({"learning_rate": {"low": 0, "high": 1, "log": True}}, "needs low > 0"),
    ({"lora_rank": []}, "lists no choices"),
    ({"lora_rank": {"min": 1}}, "needs a list of choices"),
])
def test_bad_search_spaces_are_config_errors(section, message):
    with pytest.raises(ConfigError, match=message):
        parse_space(section)


def test_int_ranges_stay_ints():
    (rank,) = parse_space({"lora_rank": {"low": 4, "high": 32, "step": 4}})
    assert rank.is_int


def test_eval_metric_needs_eval_data(train_config):
    with pytest.raises(ConfigError, match="needs evaluation data"):
        study.tune(train_config(tune=SPACE), trials=1)


def test_gym_train_points_a_tune_section_to_gym_tune(train_config):
    with pytest.raises(ConfigError, match="run `gym tune CONFIG --trials N`"):
        get_train_args(train_config(tune=SPACE))


def test_gym_tune_command(train_config, tmp_path, capsys):
    from gym.cli import main

    config = tmp_path / "search.yaml"
    config.write_text(yaml.safe_dump(train_config(max_steps=1, output_dir=str(tmp_path / "cli-search"),
                                                  tune={"learning_rate": [1e-3, 1e-2]})))
    assert main(["tune", str(config), "--trials", "2", "--metric", "loss"]) == 0
    printed = capsys.readouterr().out
    assert "| trial | state | loss | learning_rate |" in printed
    assert f"gym train {tmp_path}/cli-search/best.yaml" in printed
    assert main(["tune", str(config), "--trials", "two"]) == 2  # a readable error, exit status 2
    assert "--trials takes a whole number" in capsys.readouterr().err
