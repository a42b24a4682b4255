"""The Train tab's form comes from the config dataclasses and the method registry, and what it makes is validated
by `gym train`'s own parser."""

from __future__ import annotations

import pytest
import yaml

from gym.config.parser import known_keys
from gym.config.stages.registry import registered_stages
from gym.core.errors import ConfigError
from gym.webui import forms


def test_the_catalogue_lists_every_key_with_help_and_default():
    rows = forms.key_catalogue()
    assert {row[0] for row in rows} == set(known_keys())
    by_key = {row[0]: row for row in rows}
    assert by_key["learning_rate"][1] == "training" and by_key["pref_beta"][1].endswith("options")
    assert all(row[4] for row in rows if row[1] in ("model", "data", "finetuning"))  # every such key explains itself


@pytest.mark.parametrize("stage", sorted(registered_stages()))
def test_a_stages_options_yaml_reads_back_as_its_defaults(stage):
    text = forms.stage_options_yaml(stage)
    values = yaml.safe_load(text) or {}
    options = registered_stages()[stage].options
    if options is None:
        assert values == {}
        return
    fields = {f.name for f in __import__("dataclasses").fields(options) if f.init}
    assert set(values) == fields
    online = registered_stages()[stage].data_kind.value == "prompt"
    more = "reward_funcs: [accuracy]" if online else ""  # the one key online stages cannot default
    config = forms.train_config({"stage": stage, "dataset": "identity"}, text, more, "out")
    assert not (set(config) & fields - {"reward_funcs"})  # at their defaults, none is written into the YAML


def test_the_form_makes_the_yaml_a_user_could_run():
    form = {"model_name_or_path": "smollm2-135m", "stage": "dpo", "finetuning_type": "lora", "dataset": ["dpo_en_demo"],
            "max_steps": 5.0, "learning_rate": 1e-4, "template": ""}
    options = forms.stage_options_yaml("dpo").replace("pref_beta: 0.1", "pref_beta: 0.2")
    config = forms.train_config(form, options, "lora_target: all", "runs/x/output")
    assert config["max_steps"] == 5 and isinstance(config["max_steps"], int)
    assert config["pref_beta"] == 0.2 and config["lora_target"] == "all" and "template" not in config
    assert config["dataset"] == "dpo_en_demo" and config["output_dir"] == "runs/x/output"


def test_a_mistyped_key_is_refused_with_the_closest_one():
    with pytest.raises(ConfigError, match="learning_rate"):
        forms.train_config({"stage": "sft"}, "", "lerning_rate: 1", "out")
    with pytest.raises(ConfigError, match="not valid YAML"):
        forms.train_config({"stage": "sft"}, "", "a: [", "out")
