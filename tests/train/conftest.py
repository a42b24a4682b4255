"""Fixtures for the stage tests: a small dataset per data kind (registered next to the tiny ones of
tests/conftest.py), a config maker for each, and the checks every stage shares."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
WORDS = ["red", "blue", "green", "cat", "dog", "sun", "moon", "tree", "rock", "fish", "bird", "star", "rain", "snow",
         "wind", "fire"]

# A reward a random tiny model can earn a little of: its answers differ in length, so groups have advantages.
REWARD_CODE = '''
def digits(prompts, completions, answer, **kwargs):
    """1 per completion that contains its answer, plus a little per character."""
    return [float(a in c) + 0.01 * len(c) for c, a in zip(completions, answer)]
'''


def _register(data_dir: Path, name: str, rows: list[dict], entry: dict) -> None:
    (data_dir / f"{name}.json").write_text(json.dumps(rows))
    info = json.loads((data_dir / "dataset_info.json").read_text())
    info[name] = {"file_name": f"{name}.json", **entry}
    (data_dir / "dataset_info.json").write_text(json.dumps(info))


def _maker(train_config, **defaults):
    """config(**overrides): train_config with this kind's defaults, then the test's overrides."""
    return lambda **overrides: train_config(**{**defaults, **overrides})


@pytest.fixture()
def pairs_config(train_config, data_dir):
    """Pairwise (alpaca, ranking): "Say red." -> chosen "Red.", rejected "I will not."."""
    rows = [{"instruction": f"Say {w}.", "input": "", "chosen": f"{w.capitalize()}.", "rejected": "I will not."}
            for w in WORDS]
    _register(data_dir, "tiny_pairs", rows, {"ranking": True, "columns": {
        "prompt": "instruction", "query": "input", "chosen": "chosen", "rejected": "rejected"}})

    return _maker(train_config, stage="dpo", dataset="tiny_pairs", cutoff_len=96, max_samples=16, max_steps=2,
                  learning_rate=1e-2, logging_steps=1)


@pytest.fixture()
def feedback_config(train_config, data_dir):
    """Feedback (openai messages + kto_tag): the word back is desirable, a refusal is not; alternating."""
    rows = [{"messages": [{"role": "user", "content": f"Say {w}."},
                          {"role": "assistant", "content": f"{w.capitalize()}." if i % 2 == 0 else "I will not."}],
             "label": i % 2 == 0} for i, w in enumerate(WORDS)]
    _register(data_dir, "tiny_feedback", rows, {"formatting": "openai", "columns": {
        "messages": "messages", "kto_tag": "label"}})

    return _maker(train_config, stage="kto", dataset="tiny_feedback", cutoff_len=96, max_samples=16, max_steps=2,
                  learning_rate=1e-2, logging_steps=1)


@pytest.fixture()
def labelled_config(train_config, data_dir):
    """Labelled (text + label), alternating: "Tell me about the red." is safe, "Help me hurt the red." unsafe."""
    rows = [row for w in WORDS for row in ({"text": f"Tell me about the {w}.", "label": "safe"},
                                           {"text": f"Help me hurt the {w}.", "label": "unsafe"})]
    _register(data_dir, "tiny_labelled", rows, {"columns": {"prompt": "text", "label": "label"}})

    return _maker(train_config, stage="cls", dataset="tiny_labelled", cutoff_len=64, per_device_train_batch_size=8,
                  max_steps=30, learning_rate=1e-3, logging_steps=1)


@pytest.fixture()
def prompt_config(train_config, data_dir, tmp_path):
    """Prompt-only with an answer column ("What is 3 + 4?" -> "7"), rewarded by REWARD_CODE."""
    rows = [{"question": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)} for i in range(8)]
    _register(data_dir, "sums", rows, {"columns": {"prompt": "question", "answer": "answer"}})
    reward_file = tmp_path / "tiny_rewards.py"
    reward_file.write_text(REWARD_CODE)

    return _maker(train_config, dataset="sums", max_steps=2, max_completion_length=8, learning_rate=5e-3, bf16=False,
                  logging_steps=1, reward_funcs=[f"python:{reward_file}:digits"])


@pytest.fixture()
def capture_trainer(monkeypatch):
    """capture_trainer(method_module) -> a dict that will hold the trainer the method builds."""

    def install(module) -> dict:
        seen: dict = {}
        original = module.train_and_save

        def capture(trainer, setup, args):
            seen["trainer"] = trainer
            return original(trainer, setup, args)

        monkeypatch.setattr(module, "train_and_save", capture)
        return seen

    return install


@pytest.fixture()
def assert_only_adapter_trained(tiny_model_dir):
    """One trained LoRA adapter saved (no `ref` copy beside it) that changes only the LoRA target modules."""

    def check(out: Path) -> None:
        from peft import AutoPeftModelForCausalLM

        for name in ("adapter_config.json", "adapter_model.safetensors", "gym_manifest.json"):
            assert (out / name).is_file(), name
        extra = [p.relative_to(out) for p in out.rglob("adapter_*") if p.parent != out]
        assert not extra and not (out / "ref").exists(), f"more than one adapter saved: {extra}"
        adapter = load_file(str(out / "adapter_model.safetensors"))
        assert not any(".ref." in k for k in adapter)
        lora_b = [v for k, v in adapter.items() if "lora_B" in k]
        assert lora_b and all(v.abs().sum() > 0 for v in lora_b), "every lora_B starts at zero and must have trained"

        base = load_file(str(tiny_model_dir / "model.safetensors"))
        merged = AutoPeftModelForCausalLM.from_pretrained(out).merge_and_unload().state_dict()
        changed = {k for k in base if not torch.equal(base[k], merged[k])}
        assert changed, "the adapter should change the merged weights"
        assert all(any(t in k for t in LORA_TARGETS) for k in changed), sorted(changed)
        assert any("q_proj" in k for k in changed) and any("down_proj" in k for k in changed)  # all linear layers

    return check

