from __future__ import annotations

from pathlib import Path

import pytest

from gym import Trainer, TrainingConfig
from gym.core.errors import ConfigError
from gym.hparams import get_train_args


def test_python_api_runs_the_same_path_as_the_cli(train_config):
    config = train_config()
    model_path = config.pop("model_name_or_path")
    stage = config.pop("stage")
    dataset = config.pop("dataset")
    result = Trainer(TrainingConfig(model=model_path, algorithm=stage, **config)).train(dataset=dataset)
    assert result.global_step == 3
    assert (Path(result.output_dir) / "adapter_model.safetensors").is_file()


def test_training_config_validates_at_construction():
    with pytest.raises(ConfigError, match="Did you mean 'learning_rate'"):
        TrainingConfig(learnin_rate=1e-4)


def test_get_train_args_is_the_llamafactory_entry_point():
    model, data, training, finetuning, generating = get_train_args({"template": "qwen3", "finetuning_type": "lora"})
    assert data.template == "qwen3" and finetuning.finetuning_type == "lora"
