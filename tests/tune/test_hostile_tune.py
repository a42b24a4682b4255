"""Issue #39, `gym tune`: a search space or a --metric that cannot work is one `gym: error:` line and exit status 2
before the first trial trains (not a traceback from Optuna, nor an error after a whole trial)."""

from __future__ import annotations

import re

import pytest
import yaml

from gym.cli import main
from gym.config.parser import get_train_args
from gym.core.errors import ConfigError
from gym.tune import study
from gym.tune.metrics import TrialMetrics, trial_metrics
from gym.tune.space import parse_space

pytest.importorskip("optuna", reason="gym tune needs Optuna: pip install 'zoo-gym[tune]' (part of the dev install)")

NAN, INF = float("nan"), float("inf")


@pytest.fixture()
def no_trials(monkeypatch):
    """A trial that starts fails the test: these mistakes must be caught before one trains."""
    def refuse(config):
        raise AssertionError("a trial started")

    monkeypatch.setattr(study, "run_exp", refuse)


def _run_tune(tmp_path, config, *flags):
    path = tmp_path / "search.yaml"
    path.write_text(yaml.safe_dump(config))
    return main(["tune", str(path), "--trials", "2", *flags])


# ---------------------------------------------------------------- the search space

BAD_SPACES = [
    ({"learning_rate": {"low": 1e-5, "high": 1e-3, "step": -1e-5}}, "'learning_rate': step must be a number above 0"),
    ({"learning_rate": {"low": 1e-5, "high": 1e-3, "step": 0}}, "step must be a number above 0, got 0"),
    ({"learning_rate": {"low": 1e-5, "high": 1e-3, "step": "abc"}}, "step must be a number above 0, got 'abc'"),
    ({"learning_rate": {"low": 1e-5, "high": 1e-3, "step": NAN}}, "step must be a number above 0, got nan"),
    ({"learning_rate": {"low": NAN, "high": 1e-3}}, "'learning_rate' needs numbers low < high, got low=nan"),
    ({"learning_rate": {"low": 1e-5, "high": NAN}}, "needs numbers low < high, got low=1e-05, high=nan"),
    ({"learning_rate": {"low": 1e-5, "high": INF}}, "needs numbers low < high, got low=1e-05, high=inf"),
    ({"learning_rate": {"low": "abc", "high": 1e-3}}, "needs numbers low < high, got low='abc'"),
    ({"learning_rate": {"low": 1e-5, "high": 1e-3, "log": True, "step": 1e-5}}, "step and log: true do not go"),
    ({"learning_rate": {"low": 1e-5, "high": 1e-3, "log": "yes"}}, "log is true or false, got 'yes'"),
    ({"lora_rank": {"low": 4, "high": 32, "step": 2.5}}, "range of whole numbers (4 to 32), so step must be whole"),
    ({"lora_target": [["q_proj"], ["v_proj"]]}, "each choice is a number, a string, true/false or null, got ['q_"),
    ({"lora_rank": [8, NAN]}, "each choice is a number, a string, true/false or null, got nan"),
]


@pytest.mark.parametrize(("section", "fragment"), BAD_SPACES)
def test_bad_search_spaces_are_config_errors(section, fragment):
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        parse_space(section)


@pytest.mark.parametrize(("section", "fragment"), BAD_SPACES[:6])
def test_bad_search_spaces_exit_2_before_a_trial(train_config, tmp_path, capsys, no_trials, section, fragment):
    assert _run_tune(tmp_path, train_config(val_size=0.25, tune=section)) == 2
    err = capsys.readouterr().err
    assert err.count("gym: error:") == 1 and fragment in err and "Traceback" not in err


def test_good_spaces_still_parse():
    rate, rank, dropout, target = parse_space({
        "learning_rate": {"low": "1e-5", "high": 1e-3, "log": True}, "lora_rank": {"low": 4, "high": 32, "step": 4.0},
        "lora_dropout": {"low": 0.0, "high": 0.2, "step": 0.05, "log": None}, "lora_target": ["q_proj,v_proj", "all"]})
    assert rate.log and rank.is_int and rank.step == 4 and dropout.step == 0.05 and not dropout.log
    assert target.choices == ("q_proj,v_proj", "all")


# ---------------------------------------------------------------- the metric

def test_an_unknown_metric_exits_2_before_a_trial(train_config, tmp_path, capsys, no_trials):
    config = train_config(val_size=0.25, tune={"learning_rate": [1e-3, 1e-2]})
    assert _run_tune(tmp_path, config, "--metric", "eval_los") == 2
    err = capsys.readouterr().err
    assert err.count("gym: error:") == 1 and "Traceback" not in err
    assert "--metric eval_los: no trial of this config reports it. Did you mean 'eval_loss'?" in err
    assert _run_tune(tmp_path, config, "--metric", "accuracy") == 2
    err = capsys.readouterr().err
    assert "--metric accuracy: no trial of this config reports it." in err and "It reports: loss, train_loss" in err


def test_an_eval_metric_without_eval_data_exits_2_before_a_trial(train_config, tmp_path, capsys, no_trials):
    assert _run_tune(tmp_path, train_config(tune={"learning_rate": [1e-3, 1e-2]})) == 2  # --metric eval_loss
    assert "--metric eval_loss needs evaluation data" in capsys.readouterr().err


def test_the_metrics_a_trial_reports_follow_the_config(train_config):
    plain = trial_metrics(get_train_args(train_config()))
    assert "train_loss" in plain.names and "eval_loss" not in plain.names and not plain.evaluates
    evaluated = trial_metrics(get_train_args(train_config(val_size=0.25)))
    assert "eval_loss" in evaluated.names and evaluated.evaluates
    tasks = trial_metrics(get_train_args(train_config(eval_tasks=["mc_demo", "ppl:identity", "lm_eval:hellaswag"])))
    assert {"eval_mc_demo_acc", "eval_ppl_identity_loss"} <= set(tasks.names)
    assert tasks.prefixes == ("eval_lm_eval_hellaswag_",)
    # an eval task's score needs no evaluation data of the trainer's
    assert tasks.check("eval_mc_demo_acc") is False and tasks.check("eval_lm_eval_hellaswag_acc_norm") is False
    with pytest.raises(ConfigError, match="Did you mean 'eval_mc_demo_acc'"):
        tasks.check("eval_mc_demo_ac")


def test_a_stages_own_eval_metric_is_checked_at_the_first_evaluation():
    metrics = TrialMetrics(("loss", "eval_loss"), evaluates=True)
    assert metrics.check("eval_rewards/accuracies") is True  # DPO's: not known from the config
    with pytest.raises(ConfigError, match="Did you mean 'eval_loss'"):
        metrics.check("eval_lss")  # a near miss is a typo, refused now

    class Trial:
        reported: list = []

        def report(self, value, step):
            self.reported.append((value, step))

        def should_prune(self):
            return False

    state = type("State", (), {"global_step": 3})()
    callback = study._ReportEvalLoss(Trial(), "eval_rewards/accuracies", confirm=True)
    with pytest.raises(ConfigError, match="the trial's evaluation reports eval_loss, eval_runtime, not it"):
        callback.on_evaluate(None, state, None, metrics={"eval_loss": 1.0, "eval_runtime": 0.1})
    present = study._ReportEvalLoss(Trial(), "eval_rewards/accuracies", confirm=True)
    present.on_evaluate(None, state, None, metrics={"eval_loss": 1.0, "eval_rewards/accuracies": 0.75})
    assert Trial.reported == [(0.75, 3)]


# ---------------------------------------------------------------- trials that diverge, and resumed searches

def _fake_trials(monkeypatch, value):
    """Trials that report `value` as eval_loss without training; more than 8 of them means the search never ends."""
    from types import SimpleNamespace

    calls: list[dict] = []

    def run(config):
        calls.append(config)
        if len(calls) > 8:
            raise AssertionError("the search kept running trials")
        return SimpleNamespace(final_loss=value, metrics={"eval_loss": value})

    monkeypatch.setattr(study, "run_exp", run)
    return calls


def test_a_space_where_every_trial_diverges_stops_with_one_line(train_config, tmp_path, capsys, monkeypatch):
    calls = _fake_trials(monkeypatch, NAN)
    config = train_config(val_size=0.25, output_dir=str(tmp_path / "search"), tune={"learning_rate": [1e30, 1e31]})
    assert _run_tune(tmp_path, config) == 2  # --trials 2: two diverged trials end it, not an endless search
    err = capsys.readouterr().err
    assert err.count("gym: error:") == 1 and "Traceback" not in err and len(calls) == 2
    assert "2 trials in a row ended with a non-finite eval_loss (trial 0: nan with learning_rate=" in err
    assert "| 0 | fail |" in (tmp_path / "search" / "tune_results.md").read_text()


def test_a_diverged_trial_among_good_ones_is_run_again(train_config, tmp_path, monkeypatch):
    from types import SimpleNamespace

    values = iter([1.0, NAN, 2.0])
    monkeypatch.setattr(study, "run_exp", lambda config: SimpleNamespace(final_loss=None,
                                                                         metrics={"eval_loss": next(values)}))
    config = train_config(val_size=0.25, output_dir=str(tmp_path / "search"), tune={"learning_rate": [1e-3, 1e-2]})
    result = study.tune(config, trials=2)
    assert result.completed == 2 and result.best_value == 1.0


def test_a_resumed_search_keeps_its_metric_direction_and_ranges(train_config, tmp_path, capsys, monkeypatch):
    calls = _fake_trials(monkeypatch, 1.0)
    config = train_config(val_size=0.25, output_dir=str(tmp_path / "search"),
                          tune={"learning_rate": {"low": 1e-4, "high": 1e-2, "log": True}, "lora_rank": [4, 8]})
    assert _run_tune(tmp_path, config) == 0 and len(calls) == 2
    capsys.readouterr()
    db = tmp_path / "search" / "tune.db"
    # Optuna would keep minimizing, and compare loss with the eval_loss of earlier trials: both are refused.
    assert _run_tune(tmp_path, config, "--direction", "maximize") == 2
    assert f"{db} is a search that minimizes eval_loss: run it with --direction minimize" in capsys.readouterr().err
    assert _run_tune(tmp_path, config, "--metric", "loss") == 2
    assert f"{db} is a search on --metric eval_loss: run it with --metric eval_loss" in capsys.readouterr().err
    # Optuna refuses another kind of range only mid-trial, with a traceback.
    changed = {**config, "tune": {"learning_rate": {"low": 1e-4, "high": 1e-2}, "lora_rank": [4, 8]}}
    assert _run_tune(tmp_path, changed) == 2
    err = capsys.readouterr().err
    assert err.count("gym: error:") == 1 and "Traceback" not in err
    assert ("'learning_rate' is searched in" in err and "as a range {low: 0.0001, high: 0.01, log: true}, now as a "
            "range {low: 0.0001, high: 0.01}" in err)
    assert _run_tune(tmp_path, {**config, "tune": {**config["tune"], "lora_rank": [4, 8, 16]}}) == 2
    assert "'lora_rank' is searched in" in capsys.readouterr().err and len(calls) == 2
    # A range's ends may move, and the search goes on.
    narrowed = {**config, "tune": {"learning_rate": {"low": 1e-3, "high": 1e-2, "log": True}, "lora_rank": [4, 8]}}
    path = tmp_path / "search.yaml"
    path.write_text(yaml.safe_dump(narrowed))
    assert main(["tune", str(path), "--trials", "3"]) == 0 and len(calls) == 3


@pytest.mark.parametrize("where", ["file", "file/search"])
def test_a_file_in_the_way_of_output_dir_exits_2_before_a_trial(train_config, tmp_path, capsys, no_trials, where):
    (tmp_path / "file").write_text("mine")
    config = train_config(val_size=0.25, output_dir=str(tmp_path / where), tune={"learning_rate": [1e-3, 1e-2]})
    assert _run_tune(tmp_path, config) == 2
    err = capsys.readouterr().err
    assert err.count("gym: error:") == 1 and "Traceback" not in err and "is a file" in err
    assert (tmp_path / "file").read_text() == "mine"


@pytest.mark.parametrize("kind", ["text", "folder"])
def test_a_tune_db_that_is_no_study_exits_2_and_is_left_alone(train_config, tmp_path, capsys, no_trials, kind):
    db = tmp_path / "search" / "tune.db"
    if kind == "folder":
        db.mkdir(parents=True)
    else:
        db.parent.mkdir()
        db.write_text("my notes")
    config = train_config(val_size=0.25, output_dir=str(tmp_path / "search"), tune={"learning_rate": [1e-3, 1e-2]})
    assert _run_tune(tmp_path, config) == 2
    err = capsys.readouterr().err
    assert err.count("gym: error:") == 1 and "Traceback" not in err
    assert f"{db} cannot be opened as a gym tune study" in err
    assert db.is_dir() if kind == "folder" else db.read_text() == "my notes"


def test_a_trial_whose_training_diverges_is_not_the_best_on_loss(train_config, tmp_path, capsys):
    """transformers logs a NaN loss as 0 when nothing finite is in its window: with --metric loss a diverged trial
    read as the best (loss 0.0000), and best.yaml held its learning rate."""
    config = train_config(max_steps=2, logging_steps=1, output_dir=str(tmp_path / "search"),
                          tune={"learning_rate": [1e32]})
    assert _run_tune(tmp_path, config, "--metric", "loss") == 2
    err = capsys.readouterr().err
    assert "2 trials in a row ended with a non-finite loss (trial 0: nan with learning_rate=1e+32" in err
    assert not (tmp_path / "search" / "best.yaml").exists()
    assert "logging_nan_inf_filter" not in (tmp_path / "search.yaml").read_text()  # the user's config is untouched
