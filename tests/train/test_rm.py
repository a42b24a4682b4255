"""stage: rm on the tiny model: a LoRA reward model learns to rank chosen over rejected on held-out
pairs, trains only its adapter and score head, and its output folder is what `reward_model:` reads."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from gym.rewards.functions import get_reward_funcs, load_reward_model
from gym.train.harness import read_log
from gym.workflows.training import run_exp

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def test_reward_model_ranks_held_out_pairs_and_serves_as_a_reward(pairs_config, tiny_model_dir):
    result = run_exp(pairs_config(stage="rm", max_steps=12, val_size=0.25, learning_rate=5e-3))
    out = Path(result.output_dir)
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert adapter["task_type"] == "SEQ_CLS"
    assert json.loads((out / "gym_manifest.json").read_text())["stage"] == "rm"
    assert any(k.startswith("accuracy") or k == "accuracy" for e in read_log(out) for k in e)
    # Chosen answers repeat the word, rejected ones refuse: 4 held-out pairs, all ranked right.
    assert result.metrics["eval_accuracy"] == 1.0

    # Only the adapter and the new score head moved.
    model, _, _ = load_reward_model(str(out.resolve()))
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    trained = {k.removeprefix("model."): v for k, v in model.state_dict().items()}
    changed = {k for k, v in base.items() if k.removeprefix("model.") in trained
               and not torch.equal(v, trained[k.removeprefix("model.")])}
    assert changed and all(any(t in k for t in LORA_TARGETS) for k in changed), sorted(changed)

    # The folder is a reward for the online stages: it scores a correct answer above a refusal.
    (reward,), _ = get_reward_funcs([f"reward_model:{out}"])
    prompts = [[{"role": "user", "content": "Say moon."}]] * 2
    completions = [[{"role": "assistant", "content": "Moon."}], [{"role": "assistant", "content": "I will not."}]]
    good, bad = reward(prompts=prompts, completions=completions)
    assert good > bad
