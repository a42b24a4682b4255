"""Validation happens once, when the config is parsed: every door (CLI, Python API, get_train_args) rejects a
config that cannot run before any model or data loads, and the message names the key."""

from __future__ import annotations

import pytest
from tests.gym_cli import assert_one_line_error, gym_here

from gym.config.data import TEMPLATE_NAMES
from gym.config.parser import get_train_args
from gym.config.stages.registry import registered_stages
from gym.core.errors import ConfigError
from gym.python_api import TrainingConfig

ONLINE = {"reward_funcs": ["accuracy"], "per_device_train_batch_size": 4}


@pytest.mark.parametrize(("config", "match"), [
    ({"stage": "grpo", "num_generations": 1, **ONLINE}, "'num_generations' must be at least 2"),
    ({"stage": "rloo", "num_generations": 3, **ONLINE}, r"\(4\) .* multiple of num_generations \(3\)"),
    ({"stage": "grpo", "per_device_train_batch_size": 4}, "This stage needs rewards"),
    ({"stage": "gspo", "reward_funcs": ["acuracy"], "per_device_train_batch_size": 4}, "Did you mean 'accuracy'"),
    ({"stage": "grpo", "reward_funcs": ["accuracy"], "reward_weights": [1, 2], **ONLINE}, "reward_weights has 2"),
    ({"stage": "ppo", "ppo_epochs": 0, **ONLINE}, "'ppo_epochs' must be at least 1"),
    ({"stage": "ppo", "pissa_init": True, **ONLINE}, "does not support `pissa_init`"),
    ({"stage": "dpo", "pref_beta": 0}, "'pref_beta' must be positive"),
    ({"stage": "dpo", "dpo_label_smoothing": 0.5}, r"'dpo_label_smoothing' must be in \[0, 0.5\)"),
    ({"stage": "orpo", "pref_loss": "ipo"}, "stage: orpo uses pref_loss orpo"),
    ({"stage": "orpo", "pref_ftx": 0.5}, "'pref_ftx' does not apply to orpo"),
    ({"stage": "simpo", "ref_model": "x"}, "'ref_model' has no effect"),
    ({"stage": "kto", "pref_ftx": 1.0}, "'pref_ftx' is not supported by kto"),
    ({"stage": "rm", "delta_compression": "bitdelta"}, "delta_compression applies to language models"),
    ({"finetuning_type": "full", "use_dora": True}, "'use_dora' needs finetuning_type: lora"),
    ({"finetuning_type": "freeze", "adapter_name_or_path": "a"}, "continues training an adapter"),
    # Keys of another finetuning type, which nothing read (the run trained without what they asked for):
    ({"freeze_trainable_layers": 1}, "'freeze_trainable_layers' picks what trains under finetuning_type: freeze, "
                                     "and this run is lora .*additional_target"),
    ({"finetuning_type": "full", "freeze_extra_modules": "embed_tokens"}, "'freeze_extra_modules' picks what"),
    ({"finetuning_type": "freeze", "additional_target": "embed_tokens"},
     "'additional_target' .* needs finetuning_type: lora .*freeze_extra_modules"),
    ({"finetuning_type": "oft", "additional_target": "embed_tokens"}, "'additional_target' .* needs finetuning_type"),
    ({"use_dora": True, "pissa_init": True}, "'use_dora' and 'pissa_init' cannot be combined"),
    ({"lora_rank": 0}, "'lora_rank' must be positive"),
    ({"cutoff_len": 0}, "'cutoff_len' must be positive"),
    ({"template": "lama3"}, r"Unknown template 'lama3'\. Did you mean 'llama3'\? Known: alpaca, chatml"),
    ({"val_size": 0.1, "eval_dataset": "x"}, "either 'val_size' or 'eval_dataset'"),
    ({"bf16": True, "fp16": True}, "At most one of fp16 and bf16"),  # transformers' own check, as a ConfigError
    ({"learning_rate": -1}, "'learning_rate' must be >= 0"),
    ({"per_device_train_batch_size": 0}, "'per_device_train_batch_size' must be at least 1"),
    ({"top_p": 1.5}, r"'top_p' must be in \(0, 1\]"),
    ({"max_new_tokens": 0}, "'max_new_tokens' must be at least 1"),
    # Values Hugging Face or peft take and then train nothing, silently, or fail once the model has loaded:
    ({"max_steps": 0, "num_train_epochs": 0}, "Nothing to train: max_steps 0 and num_train_epochs 0"),
    ({"num_train_epochs": -1}, "Nothing to train"),
    ({"save_strategy": "steps", "save_steps": 0}, "'save_steps' must be positive with save_strategy: steps"),
    ({"eval_strategy": "steps"}, "'eval_strategy: steps' needs evaluation data: set val_size"),
    ({"neftune_noise_alpha": -1}, "'neftune_noise_alpha' must be positive"),
    ({"weight_decay": -1}, "'weight_decay' must be 0 or more"),
    ({"lora_alpha": 0}, "'lora_alpha' must be positive"),
    ({"lora_dropout": 1.5}, r"'lora_dropout' must be in \[0, 1\)"),
    ({"lora_target": " , "}, "'lora_target' is empty"),
    ({"loraplus_lr_ratio": -1}, "'loraplus_lr_ratio' must be positive"),
    ({"val_size": 1.5}, "'val_size' is a share below 1 or a whole number of rows, got 1.5"),
    ({"val_size": 1.0}, r"'val_size: 1.0' is a share of all the training rows.*\(1 holds out one row\)"),
    ({"val_size": "1.0"}, r"'val_size: 1.0' is a share of all"),  # as `gym train cfg.yaml val_size=1.0` gives it
    ({"stage": "dpo", "packing": True}, "'packing' applies to stage sft and pt .* stage dpo trains on whole rows"),
    ({"stage": "kto", "neat_packing": True}, "'neat_packing' applies to stage sft and pt"),
    ({"stage": "dpo", "pref_ftx": -1}, "'pref_ftx' must be >= 0"),
    ({"stage": "simpo", "simpo_gamma": -0.5}, "'simpo_gamma' .* must be >= 0"),
    ({"stage": "kto", "kto_chosen_weight": -1}, "'kto_chosen_weight' must be >= 0"),
    ({"stage": "kto", "kto_chosen_weight": 0, "kto_rejected_weight": 0}, "both 0"),
])
def test_an_impossible_config_is_refused_at_parse_time(config, match):
    with pytest.raises(ConfigError, match=match):
        get_train_args(config)


def test_evaluation_and_checkpoint_keys_with_what_they_need_parse():
    """The checks above refuse only the broken form: eval_strategy with evaluation data, a fractional save_steps,
    whole-number val_size, packing on sft, and one zero kto weight are all runnable."""
    args = get_train_args({"eval_strategy": "steps", "val_size": 0.1, "save_strategy": "steps", "save_steps": 0.5,
                           "max_steps": 0, "packing": True})
    assert (args.training.eval_strategy, args.training.save_steps, args.data.packing) == ("steps", 0.5, True)
    assert get_train_args({"val_size": 3.0}).data.val_size == 3
    assert get_train_args({"val_size": 1}).data.val_size == 1 and get_train_args({"val_size": "1"}).data.val_size == 1
    assert get_train_args({"stage": "kto", "kto_rejected_weight": 0}).options.kto_rejected_weight == 0


def test_every_door_refuses_it_before_anything_loads(monkeypatch):
    """The Python API fails at construction: no model, tokenizer or dataset is touched."""
    import gym.train.workflow as workflow

    monkeypatch.setattr(workflow, "prepare", lambda *a, **k: pytest.fail("the run started"))
    with pytest.raises(ConfigError, match="'num_generations' must be at least 2"):
        TrainingConfig(stage="grpo", num_generations=1, reward_funcs=["accuracy"])


def test_a_misspelt_template_is_refused_by_gym_train_before_the_tokenizer_loads(monkeypatch, tmp_path, train_config):
    """It was refused only once the tokenizer had loaded (by the chat format), after the model was resolved."""
    import yaml

    import gym.train.workflow as workflow

    monkeypatch.setattr(workflow, "resolve_model_path", lambda *a, **k: pytest.fail("the model was looked up"))
    monkeypatch.setattr(workflow, "load_tokenizer", lambda *a, **k: pytest.fail("the tokenizer loaded"))
    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump(train_config(template="lama3")))
    assert_one_line_error(gym_here("train", config), "Unknown template 'lama3'. Did you mean 'llama3'?")


def test_every_named_template_is_known_to_the_config():
    from gym.data.templates import TEMPLATES

    assert sorted(TEMPLATE_NAMES) == sorted(TEMPLATES)
    assert get_train_args({"template": "qwen3_vl_nothink"}).data.template == "qwen3_vl_nothink"


def test_a_valid_config_of_every_stage_parses():
    """Each registered method's defaults (plus rewards for the online ones) form a runnable config."""
    for name, method in registered_stages().items():
        online = method.data_kind.value == "prompt"
        args = get_train_args({"stage": name, **(ONLINE if online else {})})
        assert args.finetuning.stage == name
        assert (args.options is None) == (method.options is None)
        if method.options is not None:
            assert isinstance(args.options, method.options)


def test_a_forced_loss_stage_resolves_its_loss():
    assert get_train_args({"stage": "simpo"}).options.pref_loss == "simpo"
    assert get_train_args({"stage": "dpo", "pref_loss": "ipo"}).options.pref_loss == "ipo"


def test_unpacks_as_the_five_llama_factory_dataclasses():
    from gym.hparams import get_train_args as hparams_get_train_args

    model, data, training, finetuning, generating = hparams_get_train_args({"stage": "dpo", "pref_beta": 0.2})
    args = hparams_get_train_args({"stage": "dpo", "pref_beta": 0.2})
    assert type(args) is tuple and len(args) == 5  # LLaMA-Factory's plain five-tuple: indexing works too
    assert args[0].model_name_or_path == model.model_name_or_path and args[3].stage == "dpo"
    assert finetuning.stage == "dpo" and finetuning.stage_options.pref_beta == 0.2 and data.cutoff_len == 2048
