"""Shared fixtures: a tiny Llama built locally around the embedded tokenizer, and small datasets.

Nothing here touches the network: HF_HUB_OFFLINE is forced on for the whole session.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def embedded_dir() -> Path:
    """The embedded SmolLM2 converted into Gym's cache (converted once per machine)."""
    from gym.models.loader import resolve_model_path

    return Path(resolve_model_path("smollm2-135m"))


@pytest.fixture(scope="session")
def tokenizer(embedded_dir):
    from gym.models.loader import load_tokenizer

    return load_tokenizer(str(embedded_dir))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer) -> Path:
    """A 2-layer Llama with the embedded tokenizer: real architecture, trains in well under a second."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    path = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture()
def data_dir(tmp_path) -> Path:
    """A dataset_dir with small alpaca, sharegpt and text datasets registered in dataset_info.json."""
    alpaca = [{"instruction": f"Add {i} and {i + 1}.", "input": "", "output": f"{i} + {i + 1} = {2 * i + 1}."}
              for i in range(24)]
    chat = [{"conversations": [{"from": "human", "value": f"Say {w}."}, {"from": "gpt", "value": w},
                               {"from": "human", "value": "Again, louder."}, {"from": "gpt", "value": w.upper()}]}
            for w in ["hello", "tree", "river", "stone", "cloud", "light", "house", "bird"]]
    text = [{"text": f"Document {i}: the number {i} squared is {i * i}."} for i in range(20)]
    (tmp_path / "alpaca.json").write_text(json.dumps(alpaca))
    (tmp_path / "chat.json").write_text(json.dumps(chat))
    (tmp_path / "text.jsonl").write_text("".join(json.dumps(r) + "\n" for r in text))
    (tmp_path / "dataset_info.json").write_text(json.dumps({
        "tiny_alpaca": {"file_name": "alpaca.json"},
        "tiny_chat": {"file_name": "chat.json", "formatting": "sharegpt", "columns": {"messages": "conversations"}},
        "tiny_text": {"file_name": "text.jsonl", "columns": {"prompt": "text"}},
    }))
    return tmp_path


@pytest.fixture()
def train_config(tiny_model_dir, data_dir, tmp_path):
    """A complete, fast sft config on the tiny model; tests override what they exercise."""

    def make(**overrides):
        config = {
            "model_name_or_path": str(tiny_model_dir), "stage": "sft", "finetuning_type": "lora",
            "dataset": "tiny_alpaca", "dataset_dir": str(data_dir), "cutoff_len": 64,
            "output_dir": str(tmp_path / "out"), "per_device_train_batch_size": 4, "max_steps": 3,
            "learning_rate": 1e-2, "save_strategy": "no", "report_to": "none", "disable_tqdm": True, "seed": 0,
        }
        config.update(overrides)
        return config

    return make


@pytest.fixture()
def make_finetune(tiny_model_dir, tmp_path):
    """make_finetune(change, name) -> a model folder: the tiny base with change(name, param) applied in place,
    so a test knows exactly what a fine-tune changed."""
    import torch
    from transformers import AutoModelForCausalLM

    def make(change, name: str = "finetuned") -> Path:
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        with torch.no_grad():
            for param_name, param in model.named_parameters():
                change(param_name, param)
        out = tmp_path / name
        model.save_pretrained(out)
        return out

    return make
