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



def test_get_train_args_takes_an_argv_list_as_gym_train_does(tmp_path):
    model, _, training, finetuning, _ = get_train_args(["--model_name_or_path", "x", "--stage", "dpo",
                                                        "--learning_rate", "1e-4", "pref_beta=0.3"])
    assert (model.model_name_or_path, finetuning.stage, training.learning_rate) == ("x", "dpo", 1e-4)
    assert finetuning.stage_options.pref_beta == 0.3
    (tmp_path / "run.yaml").write_text("stage: sft\ncutoff_len: 128\n")
    _, data, _, finetuning, _ = get_train_args((str(tmp_path / "run.yaml"), "cutoff_len=64"))
    assert finetuning.stage == "sft" and data.cutoff_len == 64  # the override wins, as on the command line
    with pytest.raises(ConfigError, match="Did you mean 'learning_rate'"):
        get_train_args(["--learnig_rate", "1e-4"])
    with pytest.raises(ConfigError, match="holds strings"):
        get_train_args(["--cutoff_len", 64])


def test_export_names_python_keywords_not_cli_flags(tmp_path):
    trainer = Trainer(TrainingConfig(model="smollm2-135m", dataset="identity", output_dir=str(tmp_path / "run")))
    with pytest.raises(ConfigError, match="Unknown config key 'quantizaton'. Did you mean 'quantization'?"):
        trainer.export(tmp_path / "model.gguf", quantizaton="q4_0")
    with pytest.raises(ConfigError, match="Did you mean 'format'?"):
        trainer.export(tmp_path / "model", formt="gguf")
    with pytest.raises(ConfigError) as caught:
        trainer.export(tmp_path / "model", format="gguf-lora", export_type="bitdelta")
    assert "--" not in str(caught.value)

def test_apply_deltasoup_contributes_then_loads_the_aggregate_and_export_uses_it(train_config, make_finetune,
                                                                                tiny_model_dir, tmp_path):
    import torch
    from safetensors.torch import load_file

    from gym.soup import DeltaSoup, DeltaSoupConfig

    soup = DeltaSoup(DeltaSoupConfig(method="mean", min_contributors=2), path=tmp_path / "soup",
                     base_model=str(tiny_model_dir))
    trainer = Trainer(TrainingConfig(**train_config()))
    trainer.train()
    first = trainer.apply_deltasoup(soup, user_id="me")  # no round yet: contributed, nothing loaded
    assert first.contribution.status == "accepted" and first.model_dir is None and trainer.model_dir is None

    other = make_finetune(lambda name, p: p.add_(0.01) if name.endswith("q_proj.weight") else None, "other")
    soup.contribute(user_id="them", model=str(other))
    released = soup.aggregate()
    applied = trainer.apply_deltasoup(soup, contribute=False)
    assert applied.round == 1 and applied.model_dir == trainer.model_dir and applied.contribution is None
    # the loaded model is the base plus the round's aggregate, and export() now exports it
    exported = trainer.export(tmp_path / "exported")
    base = load_file(str(Path(tiny_model_dir) / "model.safetensors"))
    weights = load_file(str(exported / "model.safetensors"))
    name = next(n for n in released if n.endswith("q_proj.weight"))
    assert torch.allclose(weights[name], base[name] + released[name], atol=1e-6)
