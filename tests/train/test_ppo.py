"""stage: ppo — the maths against hand-computed numbers, then two real PPO steps on the tiny model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from gym.core.errors import ConfigError
from gym.train import ppo_loop
from gym.train.methods import ppo
from gym.train.ppo_math import completion_mask


def test_forward_log_probs_match_the_sampling_distribution(tiny_model_dir, tokenizer):
    """The training forward pass scores completions with the distribution generate() sampled them from
    (temperature, left-padded prompts, the one-token shift between logits and tokens)."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    torch.manual_seed(0)
    prompt_ids, prompt_mask = ppo_loop.left_pad([[5, 6, 7, 8, 9, 10], [11, 12]], tokenizer.pad_token_id)
    config = GenerationConfig(do_sample=True, temperature=0.7, top_p=1.0, top_k=0, max_new_tokens=5,
                              eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    out = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, generation_config=config,
                         output_scores=True, return_dict_in_generate=True)
    completions = out.sequences[:, prompt_ids.shape[1]:]
    sampled = torch.stack(out.scores, 1).log_softmax(-1).gather(-1, completions[..., None]).squeeze(-1)
    mask = completion_mask(completions, [tokenizer.eos_token_id])
    with torch.no_grad():
        logprobs, values, _ = ppo_loop.forward(model, torch.nn.Linear(64, 1), torch.cat([prompt_ids, completions], 1),
                                          torch.cat([prompt_mask, mask.long()], 1), prompt_ids.shape[1],
                                          temperature=0.7, bf16=False)
    assert values.shape == logprobs.shape == completions.shape
    assert torch.allclose(logprobs * mask, sampled * mask, atol=1e-4)


# --- End to end on the tiny model.

@pytest.fixture()
def ppo_config(prompt_config):
    def make(**overrides):
        values = dict(stage="ppo", per_device_train_batch_size=2, ppo_buffer_size=2, ppo_epochs=2)
        values.update(overrides)
        return prompt_config(**values)

    return make


def _weights(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def test_ppo_lora_two_steps_end_to_end(ppo_config, monkeypatch):
    from safetensors.torch import load_file

    from gym.workflows.training import run_exp

    captured = {}
    original = ppo.build_loop

    def build_and_capture(args, setup, device, max_steps):
        loop = original(args, setup, device, max_steps)
        captured["model"], captured["before"] = loop.model, _weights(loop.model)
        return loop

    monkeypatch.setattr(ppo, "build_loop", build_and_capture)
    result = run_exp(ppo_config())

    out = result.output_dir
    files = {p.name for p in Path(out).iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", ppo.VALUE_HEAD_FILE, "gym_manifest.json"} <= files
    head = load_file(str(Path(out) / ppo.VALUE_HEAD_FILE))
    assert set(head) == {"weight", "bias"} and head["weight"].shape == (1, 64)
    assert head["weight"].abs().sum() > 0  # zero-initialised, so it learned
    assert json.loads((Path(out) / "gym_manifest.json").read_text())["global_step"] == 2

    after = _weights(captured["model"])
    # Sampling merges LoRA into the base weights and unmerges it after: that round trip may leave
    # float32 rounding behind (~1e-8), which is not training.
    moved = {name for name, before in captured["before"].items()
             if not torch.allclose(before, after[name], rtol=0, atol=1e-6)}
    assert moved, "no parameter moved"
    assert all("lora_" in name for name in moved), sorted(moved)[:3]
    assert any("lora_B" in name for name in moved)  # B starts at zero: moving it changes the policy

    lines = [json.loads(line) for line in (Path(out) / "trainer_log.jsonl").read_text().splitlines()]
    assert [e["step"] for e in lines] == [1, 2] and all(e["max_steps"] == 2 for e in lines)
    for entry in lines:
        for key in ("loss", "loss/policy", "loss/value", "reward", "kl", "kl_coef", "clipfrac", "entropy",
                    "learning_rate", "response_length"):
            assert math.isfinite(entry[key]), key
        assert 1 <= entry["response_length"] <= 8
    assert lines[0]["kl"] == pytest.approx(0.0, abs=1e-4)  # the adapter starts as a no-op
    assert lines[0]["kl_coef"] == 0.2 and lines[1]["kl_coef"] != 0.2  # adaptive: it moved after step 1
    assert result.global_step == 2 and result.metrics["reward"] == lines[-1]["reward"]
    assert result.final_loss == lines[-1]["loss"] and result.tokens_seen > 0


@pytest.mark.parametrize("overrides", [
    {"finetuning_type": "full", "bf16": True},  # bf16 autocast; the master weights stay float32
    {"finetuning_type": "freeze", "freeze_trainable_layers": 1, "gradient_checkpointing": True},
], ids=["full-bf16", "freeze-checkpointing"])
def test_ppo_without_lora_keeps_a_frozen_reference(ppo_config, monkeypatch, overrides):
    from gym.workflows.training import run_exp

    captured = {}
    original = ppo.build_loop

    def build_and_capture(args, setup, device, max_steps):
        loop = original(args, setup, device, max_steps)
        captured["loop"], captured["ref"], captured["before"] = loop, _weights(loop.ref_model), _weights(loop.model)
        return loop

    monkeypatch.setattr(ppo, "build_loop", build_and_capture)
    run_exp(ppo_config(max_steps=1, ppo_buffer_size=1, ppo_epochs=1, learning_rate=1e-3, **overrides))
    loop = captured["loop"]
    assert all(torch.equal(p, captured["ref"][n]) for n, p in loop.ref_model.named_parameters())
    assert not any(p.requires_grad for p in loop.ref_model.parameters())
    after = _weights(loop.model)
    assert all(p.dtype == torch.float32 for p in after.values())
    changed = {n for n, p in captured["before"].items() if not torch.equal(p, after[n])}
    trainable = {n for n, p in loop.model.named_parameters() if p.requires_grad}
    assert changed and changed <= trainable


def test_ppo_without_a_reward_is_a_config_error(ppo_config, monkeypatch):
    from gym.workflows.training import run_exp

    with pytest.raises(ConfigError, match="reward"):
        run_exp(ppo_config(reward_funcs=None))


def test_ppo_resumes_from_a_checkpoint_as_if_never_interrupted(ppo_config, tmp_path):
    import shutil

    from safetensors.torch import load_file

    from gym.workflows.training import run_exp

    whole = tmp_path / "whole"
    run_exp(ppo_config(max_steps=3, save_strategy="steps", save_steps=1, save_total_limit=1, output_dir=str(whole)))
    # Only the newest checkpoint is kept, and none at the last step (the final model is written instead).
    assert sorted(p.name for p in whole.glob("checkpoint-*")) == ["checkpoint-2"]
    state = json.loads((whole / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and state["tokens"] > 0

    # "Interrupted" after step 2: a fresh run that only has that checkpoint, resumed.
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copytree(whole / "checkpoint-2", resumed / "checkpoint-2")
    lines = (whole / "trainer_log.jsonl").read_text().splitlines()
    (resumed / "trainer_log.jsonl").write_text(lines[0] + "\n" + lines[1] + "\n" + '{"step": 3, "stale": true}\n')
    result = run_exp(ppo_config(max_steps=3, save_strategy="steps", save_steps=1, output_dir=str(resumed),
                                resume_from_checkpoint=True))
    assert result.global_step == 3

    # The same step 3: same samples, rewards and updates, hence the same adapter and value head.
    log = [json.loads(line) for line in (resumed / "trainer_log.jsonl").read_text().splitlines()]
    assert [e["step"] for e in log] == [1, 2, 3] and "stale" not in log[2]
    original = json.loads(lines[2])
    for key in ("reward", "response_length", "kl_coef", "learning_rate"):
        assert log[2][key] == pytest.approx(original[key], abs=1e-6), key
    for name in ("adapter_model.safetensors", ppo.VALUE_HEAD_FILE):
        expected, got = load_file(str(whole / name)), load_file(str(resumed / name))
        assert all(torch.allclose(expected[k], got[k], atol=1e-5) for k in expected), name


def test_ppo_refuses_a_checkpoint_of_another_run(ppo_config, tmp_path):
    from gym.workflows.training import run_exp

    foreign = tmp_path / "out" / "checkpoint-1"
    foreign.mkdir(parents=True)
    (foreign / "trainer_state.json").write_text("{}")  # e.g. an sft checkpoint
    with pytest.raises(ConfigError, match="not a checkpoint of this kind of run"):
        run_exp(ppo_config(resume_from_checkpoint=True))
