"""Seed 001, "Gym - AI Model Training Platform" (the project description): its CLI lines, its Python API
snippet (LLaMA-Factory's entry points), its dataset formats and its command names."""

from __future__ import annotations

import json
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from gym.cli import main
from gym.core.errors import DataError

DATA = Path(__file__).resolve().parents[2] / "data"


def test_train_chat_and_api_from_flags(tiny_model_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "output" / "qwen3-lora"
    # gym train --model_name_or_path ... --template qwen3 --dataset alpaca_en_demo --finetuning_type lora --output_dir
    assert main(["train", "--model_name_or_path", str(tiny_model_dir), "--template", "qwen3",
                 "--dataset", "alpaca_en_demo", "--dataset_dir", str(DATA), "--finetuning_type", "lora",
                 "--output_dir", str(out), "--max_steps", "1", "--cutoff_len", "96", "--report_to", "none"]) == 0
    assert (out / "adapter_model.safetensors").is_file()
    capsys.readouterr()
    # gym chat --model_name_or_path ... --adapter_name_or_path ./output/qwen3-lora --template qwen3
    assert main(["chat", "--model_name_or_path", str(tiny_model_dir), "--adapter_name_or_path", str(out),
                 "--template", "qwen3", "--max_new_tokens", "4", "--prompt", "Hello"]) == 0
    assert capsys.readouterr().out.strip()
    # gym api --model_name_or_path ... --adapter_name_or_path ... --port 8000 (the server: tests/serve)
    seen = {}
    monkeypatch.setattr("gym.serve.server.serve", lambda config, **kw: seen.update(kw, config=config))
    assert main(["api", "--model_name_or_path", str(tiny_model_dir), "--adapter_name_or_path", str(out),
                 "--port", "8000"]) == 0
    assert seen["port"] == 8000 and seen["config"]["adapter_name_or_path"] == str(out)


def test_python_api_run_sft(tiny_model_dir, tmp_path):
    from gym.hparams import get_train_args
    from gym.train import run_sft

    # Configure training
    config = {
        "model_name_or_path": str(tiny_model_dir),
        "template": "qwen3",
        "dataset": "alpaca_en_demo",
        "finetuning_type": "lora",
        "output_dir": str(tmp_path / "output" / "qwen3-lora"),
        # ours: a local dataset folder and one step
        "dataset_dir": str(DATA), "max_steps": 1, "cutoff_len": 96, "report_to": "none",
    }

    # Run training
    model_args, data_args, training_args, finetuning_args, generating_args = get_train_args(config)
    result = run_sft(model_args, data_args, training_args, finetuning_args, generating_args)
    assert result.global_step == 1 and (tmp_path / "output" / "qwen3-lora" / "adapter_model.safetensors").is_file()


def test_every_stage_has_its_entry_point():
    import gym.train
    from gym.config.stages.registry import registered_stages
    from gym.core.errors import ConfigError
    from gym.hparams import get_train_args

    assert {f"run_{stage}" for stage in registered_stages()} <= set(gym.train.__all__)
    # LLaMA-Factory's order for pt/rm/dpo/kto: (model, data, training, finetuning, callbacks)
    sft_args = get_train_args({"stage": "sft"})
    with pytest.raises(ConfigError, match="run_dpo was given the arguments of a 'stage: sft' config"):
        gym.train.run_dpo(*list(sft_args)[:4], [])


def test_dataset_formats(tmp_path, tokenizer):
    from gym.config.data import DataArguments
    from gym.data.loader import get_dataset
    from gym.data.templates import get_chat_format

    alpaca = [{"instruction": "Task description", "input": "Optional context", "output": "Expected response"}]
    sharegpt = [{"conversations": [{"from": "human", "value": "User message"},
                                   {"from": "assistant", "value": "Assistant response"}]}]
    multimodal = [{"instruction": "Describe the image", "input": "", "output": "Description...",
                   "images": ["path/to/image.jpg"]}]
    chat = get_chat_format(tokenizer)
    for name, rows in (("alpaca", alpaca), ("sharegpt", sharegpt)):
        (tmp_path / f"{name}.json").write_text(json.dumps(rows))
        data = get_dataset(DataArguments(dataset=str(tmp_path / f"{name}.json"), cutoff_len=64), chat, "supervised",
                           seed=0)
        assert len(data.train) == 1 and any(label != -100 for label in data.train[0]["labels"])
    (tmp_path / "multimodal.json").write_text(json.dumps(multimodal))
    with pytest.raises(DataError, match="image"):
        get_dataset(DataArguments(dataset=str(tmp_path / "multimodal.json"), cutoff_len=64), chat, "supervised",
                    seed=0)


def test_command_names(tiny_model_dir, tmp_path, capsys):
    # `gym-cli` is the second console script; `gym inference` is `gym infer`.
    scripts = {e.name: e.value for e in entry_points(group="console_scripts") if e.name in ("gym", "gym-cli")}
    assert scripts == {"gym": "gym.cli:main", "gym-cli": "gym.cli:main"}
    rows = tmp_path / "prompts.json"
    rows.write_text(json.dumps([{"instruction": "Say hi.", "output": "hi"}]))
    out = tmp_path / "answers.jsonl"
    assert main(["inference", f"model_name_or_path={tiny_model_dir}", "--dataset", str(rows), "-o", str(out),
                 "max_new_tokens=3"]) == 0
    assert len(out.read_text().splitlines()) == 1
