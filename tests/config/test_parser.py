from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

import pytest
import yaml

from gym.config.files import parse_cli_args
from gym.config.parser import get_train_args, known_keys
from gym.core.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def test_unknown_key_names_the_closest_valid_key():
    with pytest.raises(ConfigError, match=r"Unknown config key 'lora_rnak'.*Did you mean 'lora_rank'"):
        get_train_args({"lora_rnak": 8})


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [("lora_rank", "eight", "expects an integer"), ("learning_rate", "fast", "expects a number"),
     ("packing", "maybe", "expects true or false"), ("finetuning_type", "lroa", "one of 'lora'")],
)
def test_wrong_type_says_what_was_expected(key, value, expected):
    with pytest.raises(ConfigError, match=expected):
        get_train_args({key: value})


def test_returns_the_five_concerns():
    args = get_train_args(
        {"model_name_or_path": "smollm2-135m", "dataset": "alpaca_en_demo", "lora_rank": 4, "learning_rate": "1e-4",
         "temperature": 0.3}
    )
    model, data, training, finetuning, generating = (args.model, args.data, args.training, args.finetuning,
                                                     args.generating)
    assert model.model_name_or_path == "smollm2-135m"
    assert data.dataset == "alpaca_en_demo"
    assert training.learning_rate == 1e-4  # YAML 1.1 reads 1e-4 as a string; we accept it as a number
    assert finetuning.lora_rank == 4
    assert generating.temperature == 0.3


def test_seed_spellings_are_aliases():
    args = get_train_args({"model": "zen-nano", "algorithm": "pt", "warmup_ratio": 0.1})
    assert args.model.model_name_or_path == "zen-nano"
    assert args.finetuning.stage == "pt"
    assert args.training.warmup_steps == 0.1


def test_unknown_stage_suggests():
    with pytest.raises(ConfigError, match="Did you mean 'sft'"):
        get_train_args({"stage": "sfft"})


@pytest.mark.parametrize(
    ("config", "message"),
    [({"finetuning_type": "full", "use_dora": True}, r"'use_dora' needs finetuning_type: lora \(got 'full'\)"),
     ({"use_dora": True, "pissa_init": True}, "'use_dora' and 'pissa_init' cannot be combined"),
     ({"cutoff_len": 0}, "'cutoff_len' must be positive, got 0"),
     ({"val_size": 0.1, "eval_dataset": "x"}, "either 'val_size' or 'eval_dataset', not both"),
     ({"bf16": True, "fp16": True}, "fp16 and bf16")],
    ids=["dora-without-lora", "dora-and-pissa", "cutoff-zero", "val-size-and-eval-dataset", "bf16-and-fp16"],
)
def test_impossible_combinations_are_errors(config, message):
    with pytest.raises(ConfigError, match=message):
        get_train_args(config)


def test_cli_forms_merge_with_later_winning(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("lora_rank: 4\nlearning_rate: 1.0e-3\n")
    config = parse_cli_args([str(cfg), "lora_rank=16", "--learning_rate", "2e-4", "--plot_loss", "--use_dora=true"])
    assert config == {"lora_rank": 16, "learning_rate": "2e-4", "plot_loss": True, "use_dora": True}
    args = get_train_args(config)
    assert args.finetuning.lora_rank == 16 and args.training.learning_rate == 2e-4 and args.finetuning.plot_loss


@pytest.mark.parametrize(("name", "text", "message"), [
    ("open.yaml", "lora_rank: [16\n", r"open.yaml, line 2, column 1: not valid YAML \(expected ',' or ']', .*while "
     r"parsing a flow sequence that starts at line 1, column 12\)\.$"),
    ("indent.yaml", "a: b\n  c: d\n", r"indent.yaml, line 2, column 4: not valid YAML \(mapping values are not "
     r"allowed here\)\.$"),
    ("comma.json", '{"a": 1,}', r"comma.json, line 1, column 9: not valid JSON \(Expecting property name"),
])
def test_a_config_that_does_not_parse_is_one_line_with_its_place(tmp_path, name, text, message):
    """The parsers' own messages span several lines (a caret drawing, a second mark); Gym's is one line naming
    the file, the line and the column."""
    (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError, match=message) as caught:
        parse_cli_args([str(tmp_path / name)])
    assert "\n" not in str(caught.value)


def test_a_folder_names_the_model_of_a_verb_that_loads_one(tmp_path):
    """`gym chat saves/run`: a LoRA run is its adapter, any other model folder the model; train takes configs only."""
    run, model, empty = tmp_path / "run", tmp_path / "merged", tmp_path / "empty"
    for folder in (run, model, empty):
        folder.mkdir()
    (run / "adapter_config.json").write_text("{}")
    (model / "config.json").write_text("{}")
    assert parse_cli_args([str(run), "max_new_tokens=5"], model_folders=True) == {
        "adapter_name_or_path": str(run), "max_new_tokens": 5}
    assert parse_cli_args([str(model)], model_folders=True) == {"model_name_or_path": str(model)}
    with pytest.raises(ConfigError, match="empty is a folder, but neither a model .config.json. nor an adapter"):
        parse_cli_args([str(empty)], model_folders=True)
    with pytest.raises(ConfigError, match="Two models given"):
        parse_cli_args([str(run), str(model)], model_folders=True)
    # a name that is no folder is a model name, as vLLM's `serve MODEL` takes it (the loader checks it)
    assert parse_cli_args(["smollm2-135m", "--port", "8001"], model_folders=True) == {
        "model_name_or_path": "smollm2-135m", "port": 8001}
    with pytest.raises(ConfigError, match="Unexpected argument .*give a .yaml/.json config, key=value"):
        parse_cli_args([str(run)])


def test_a_choice_yaml_reads_as_a_boolean_is_that_choice(tmp_path):
    """`save_strategy: no` is how a Trainer user writes it, and YAML 1.1 reads `no` as false."""
    from gym.config.coerce import coerce

    cfg = tmp_path / "c.yaml"
    cfg.write_text("save_strategy: no\n")
    for config in (parse_cli_args([str(cfg)]), parse_cli_args(["save_strategy=no"]),
                   parse_cli_args(["--save_strategy", "no"])):
        assert get_train_args(config).training.save_strategy == "no"
    assert coerce("mode", True, Literal["on", "off", "auto"]) == "on"
    with pytest.raises(ConfigError, match="'mode' expects one of 'off', 'no', 'auto', got False"):
        coerce("mode", False, Literal["off", "no", "auto"])  # which one false means is not for Gym to guess
    with pytest.raises(ConfigError, match="'save_strategy' expects one of .*got True"):
        get_train_args({"save_strategy": True})


def test_resume_accepts_true_and_paths():
    assert get_train_args({"resume_from_checkpoint": True}).training.resume_from_checkpoint is True
    assert get_train_args({"resume_from_checkpoint": "out/checkpoint-4"}).training.resume_from_checkpoint == (
        "out/checkpoint-4")


def test_default_output_dir_names_model_type_and_stage():
    assert get_train_args({"stage": "pt", "finetuning_type": "full"}).training.output_dir == str(
        Path("saves/smollm2-135m/full/pt"))


def test_llamafactory_yaml_loads_unchanged(tmp_path):
    """LLaMA-Factory's examples/train_lora/llama3_lora_sft.yaml, as its users have it."""
    cfg = tmp_path / "llama3_lora_sft.yaml"
    cfg.write_text("""
### model
model_name_or_path: meta-llama/Meta-Llama-3-8B-Instruct
trust_remote_code: true
### method
stage: sft
do_train: true
finetuning_type: lora
lora_rank: 8
lora_target: all
### dataset
dataset: identity,alpaca_en_demo
template: llama3
cutoff_len: 2048
max_samples: 1000
overwrite_cache: true
preprocessing_num_workers: 16
dataloader_num_workers: 4
### output
output_dir: saves/llama3-8b/lora/sft
logging_steps: 10
save_steps: 500
plot_loss: true
overwrite_output_dir: true
save_only_model: false
report_to: none
### train
per_device_train_batch_size: 1
gradient_accumulation_steps: 8
learning_rate: 1.0e-4
num_train_epochs: 3.0
lr_scheduler_type: cosine
warmup_ratio: 0.1
bf16: true
ddp_timeout: 180000000
resume_from_checkpoint: null
""")
    args = get_train_args(str(cfg))
    assert args.data.template == "llama3" and args.training.gradient_accumulation_steps == 8
    assert args.finetuning.plot_loss and args.training.warmup_steps == 0.1


def test_every_shipped_example_parses():
    examples = sorted((REPO / "examples").glob("*.yaml"))
    assert examples, "examples/ should hold runnable configs"
    for path in examples:
        config = yaml.safe_load(path.read_text())
        if path.name.startswith("tfgrpo_"):  # `gym tfgrpo` configs: their own keys and parser
            from gym.tfgrpo.config import parse_job

            parse_job(config)
            continue
        if "tune" in config:  # gym tune's search space, checked by its own parser
            from gym.tune.space import parse_space

            assert parse_space(config.pop("tune"))
        get_train_args(config)


def test_help_lists_every_key():
    from gym.config.help import train_help

    text = train_help()
    for key in known_keys():
        assert f"  {key} (" in text, key


def test_every_config_field_has_help():
    from gym.config.data import DataArguments
    from gym.config.finetuning import FinetuningArguments
    from gym.config.generating import GeneratingArguments
    from gym.config.model import ModelArguments

    for cls in (ModelArguments, DataArguments, FinetuningArguments, GeneratingArguments):
        for f in dataclasses.fields(cls):
            assert not f.init or f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help"


def test_bf16_unset_follows_the_hardware(monkeypatch):
    """Unset bf16 stays unset in the config (it is written anywhere) and is decided when the run starts."""
    import gym.train.hf_args as hf_args

    assert get_train_args({}).training.bf16 is None
    monkeypatch.setattr(hf_args, "native_bf16", lambda: False)
    assert hf_args.machine_values(get_train_args({}))["bf16"] is False
    assert hf_args.hf_training_args(get_train_args({})).bf16 is False
    monkeypatch.setattr(hf_args, "native_bf16", lambda: True)
    assert hf_args.machine_values(get_train_args({}))["bf16"] is True
    assert "bf16" not in hf_args.machine_values(get_train_args({"bf16": False}))
    assert hf_args.hf_training_args(get_train_args({"bf16": False})).bf16 is False


def test_lora_runs_tell_ddp_every_trainable_weight_is_used_unless_a_vision_part_trains():
    from gym.train import hf_args

    def unused(config: dict) -> object:
        return hf_args.hf_training_args(get_train_args(config)).ddp_find_unused_parameters

    assert unused({"finetuning_type": "lora"}) is False
    assert unused({"finetuning_type": "full"}) is None  # transformers decides, as before
    assert unused({"finetuning_type": "lora", "freeze_vision_tower": False}) is None
    assert unused({"finetuning_type": "lora", "ddp_find_unused_parameters": True}) is True


def test_a_hub_token_reaches_the_hub_libraries_but_not_the_saved_training_arguments(monkeypatch):
    """The Trainer pickles its arguments into every checkpoint (training_args.bin): the push token must not be in
    them. It goes to the environment the hub libraries read."""
    import pickle

    from gym.train.hf_args import hf_training_args

    monkeypatch.delenv("HF_TOKEN", raising=False)
    built = hf_training_args(get_train_args({"hub_token": "hf_secret_push_token"}))
    assert built.hub_token is None and b"hf_secret_push_token" not in pickle.dumps(built)
    import os

    assert os.environ["HF_TOKEN"] == "hf_secret_push_token"
