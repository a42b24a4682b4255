"""The eval keys of a config, and the training YAML's `eval_tasks` as `gym eval`'s tasks."""

from __future__ import annotations

import re

import pytest

from gym.core.errors import ConfigError
from gym.eval.config import parse_eval, parse_task


def test_a_training_yaml_gives_its_eval_tasks_and_keeps_its_model_keys():
    args, rest = parse_eval({"model_name_or_path": "smollm2-135m", "stage": "sft", "output_dir": "saves/x",
                             "eval_tasks": ["mc_demo", "ppl:identity"], "cutoff_len": 256, "batch_size": 4})
    assert args.tasks == ["mc_demo", "ppl:identity"] and args.cutoff_len == 256 and args.eval_batch_size == 4
    assert rest == {"model_name_or_path": "smollm2-135m", "stage": "sft", "output_dir": "saves/x"}
    assert [(t.kind, t.target, t.name) for t in args.parsed_tasks()] == [
        ("mc", "mc_demo", "mc_demo"), ("ppl", "identity", "ppl:identity")]


def test_task_names():
    assert parse_task("lm_eval:hellaswag,arc_easy").target == "hellaswag,arc_easy"
    assert parse_task("arithmetic").name == "arithmetic" and parse_task("gen:arithmetic_demo").name == "arithmetic"
    with pytest.raises(ConfigError, match="Did you mean 'gsm8k'"):
        parse_task("gsm8")
    with pytest.raises(ConfigError, match="kind:dataset"):
        parse_task("bleu:data")


@pytest.mark.parametrize("key, value, message", [
    ("n_shot", -1, "n_shot must be 0 or more"), ("num_samples", 0, "num_samples must be at least 1"),
    ("limit", 0, "limit must be at least 1"), ("eval_template", "html", "eval_template must be one of"),
    ("temperature", float("nan"), "'temperature' must be a number >= 0, got nan"),
    ("temperature", -1.0, "'temperature' must be a number >= 0, got -1.0"),
])
def test_bad_values_name_the_key(key, value, message):
    with pytest.raises(ConfigError, match=message):
        parse_eval({"tasks": ["mc_demo"], key: value})


def test_a_misspelt_verifier_is_named_before_the_model_loads():
    # It was found only when the generation task ran, after the model had loaded.
    with pytest.raises(ConfigError, match="Unknown reward function 'acuracy'. Did you mean 'accuracy'?"):
        parse_eval({"tasks": ["gen:qa"], "verifier": ["acuracy"]})
    parse_eval({"tasks": ["mc_demo"], "verifier": ["acuracy"]})  # no generation task reads it


def test_a_task_named_twice_runs_once(tiny_model_dir, mc_dir, monkeypatch):
    # It ran again at its full cost, and the second result replaced the first under the same name.
    from gym.eval.mc import MCTask
    from gym.eval.runner import run_eval

    args, _ = parse_eval({"tasks": ["mc_demo", "ppl:identity", "mc:mc_demo", "mc_demo", "lm_eval:a,b,a"]})
    assert args.tasks == ["mc_demo", "ppl:identity", "lm_eval:a,b,a"] and args.parsed_tasks()[2].target == "a,b"
    runs = []
    original = MCTask.run
    monkeypatch.setattr(MCTask, "run", lambda self, *a: runs.append(self.name) or original(self, *a))
    report = run_eval({"model_name_or_path": str(tiny_model_dir), "tasks": ["mc:quiz", "mc:quiz"],
                       "dataset_dir": str(mc_dir), "n_shot": 0, "limit": 1})
    assert runs == ["mc:quiz"] and report["settings"]["tasks"] == ["mc:quiz"]


@pytest.mark.parametrize("spec, message", [
    ("MMLU", "Unknown eval task 'MMLU'. Did you mean 'mmlu'?"),
    ("GSM8K", "Did you mean 'gsm8k'?"),
    ("mc_demo,arithmetic", "'mc_demo,arithmetic' names 2 tasks in one: give each its own --task"),
])
def test_a_task_in_capitals_or_a_comma_list_is_named_as_meant(spec, message):
    # difflib compares case, so `MMLU` got no suggestion; a comma list was told it might mean its last task
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_task(spec)
