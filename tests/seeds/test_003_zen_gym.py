"""Seed 003, "Zen Gym" (a model card): its three training YAML blocks and its CLI lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from gym.cli import main
from gym.config.parser import get_train_args

DATA = Path(__file__).resolve().parents[2] / "data"

LORA = """
model_name_or_path: Qwen/Qwen3-4B
stage: sft
do_train: true
finetuning_type: lora
lora_target: all
lora_rank: 64
lora_alpha: 32
learning_rate: 5.0e-5
num_train_epochs: 3
per_device_train_batch_size: 4
gradient_accumulation_steps: 8
"""

GRPO = """
model_name_or_path: Qwen/Qwen3-4B
stage: grpo
do_train: true
reward_model: zenlm/zen-reward-model
learning_rate: 1.0e-6
num_train_epochs: 2
per_device_train_batch_size: 1
gradient_accumulation_steps: 16
"""

QLORA = """
model_name_or_path: Qwen/Qwen3-7B
stage: sft
do_train: true
finetuning_type: lora
quantization_bit: 4
quantization_method: bitsandbytes
lora_rank: 64
learning_rate: 2.0e-4
"""


def test_lora_block_with_gym_cli_train_config(write_yaml, tiny_model_dir, tmp_path, capsys):
    # llamafactory-cli train --config configs/zen_nano_lora.yaml -> gym-cli train --config FILE
    config = write_yaml(LORA, model_name_or_path=str(tiny_model_dir))
    assert main(["train", "--config", str(config)]) == 2  # the block names no dataset
    assert "dataset" in capsys.readouterr().err
    out = tmp_path / "run"
    assert main(["train", "--config", str(config), "dataset=alpaca_en_demo", f"dataset_dir={DATA}", "max_steps=1",
                 "gradient_accumulation_steps=1", "cutoff_len=96", f"output_dir={out}", "report_to=none"]) == 0
    adapter = (out / "adapter_config.json").read_text()
    assert '"r": 64' in adapter and '"lora_alpha": 32' in adapter


def test_grpo_block(write_yaml, tiny_model_dir, tmp_path, capsys):
    args = get_train_args(str(write_yaml(GRPO, model_name_or_path=str(tiny_model_dir))))
    assert args.finetuning.stage == "grpo" and args.options.reward_model == "zenlm/zen-reward-model"
    # The reward model is a hub id; offline, the run stops with a clear message before training.
    config = write_yaml(GRPO, model_name_or_path=str(tiny_model_dir), dataset="arithmetic_demo",
                        dataset_dir=str(DATA), output_dir=str(tmp_path / "run"), per_device_train_batch_size=2,
                        num_generations=2, max_steps=1, report_to="none")
    assert main(["train", str(config)]) == 2
    err = capsys.readouterr().err
    assert "zenlm/zen-reward-model" in err and "Traceback" not in err, err


def test_qlora_block(write_yaml, tiny_model_dir, tmp_path):
    pytest.importorskip("bitsandbytes")
    args = get_train_args(str(write_yaml(QLORA, model_name_or_path=str(tiny_model_dir))))
    assert (args.model.quantization_bit, args.model.quantization_method) == (4, "bnb")
    out = tmp_path / "run"
    config = write_yaml(QLORA, model_name_or_path=str(tiny_model_dir), dataset="alpaca_en_demo",
                        dataset_dir=str(DATA), max_steps=1, cutoff_len=96, output_dir=str(out), report_to="none")
    assert main(["train", str(config)]) == 0
    assert (out / "adapter_model.safetensors").is_file()
