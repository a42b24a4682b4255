"""End to end on the tiny model: each finetuning type and LoRA variant trains, moves the right
parameters, and leaves a folder that peft/transformers load directly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gym.workflows.training import run_exp


def _base_state(tiny_model_dir):
    return load_file(str(Path(tiny_model_dir) / "model.safetensors"))


# Here LoRA+ only has to train and save; its learning rates per matrix: test_optimizers.py, loraplus.
@pytest.mark.parametrize(
    "variant",
    [{}, {"use_rslora": True}, {"use_dora": True}, {"pissa_init": True, "pissa_iter": 2},
     {"loraplus_lr_ratio": 16.0}, {"additional_target": "embed_tokens", "lora_target": "q_proj,v_proj"}],
    ids=["lora", "rslora", "dora", "pissa", "loraplus", "additional_target"],
)
def test_lora_variants_train_only_adapters(train_config, tiny_model_dir, variant):
    from peft import AutoPeftModelForCausalLM, PeftConfig

    config = train_config(**variant)
    result = run_exp(config)
    out = Path(result.output_dir)
    assert result.global_step == 3 and result.final_loss is not None
    for name in ("adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "gym_config.yaml",
                 "gym_manifest.json", "trainer_log.jsonl"):
        assert (out / name).is_file(), name
    adapter_cfg = PeftConfig.from_pretrained(out)
    assert adapter_cfg.use_rslora == variant.get("use_rslora", False)
    assert adapter_cfg.use_dora == variant.get("use_dora", False)
    adapter = load_file(str(out / "adapter_model.safetensors"))
    lora_b = [v for k, v in adapter.items() if "lora_B" in k]
    assert lora_b and any(v.abs().sum() > 0 for v in lora_b)  # B starts at zero: non-zero means it trained
    if "additional_target" in variant:
        assert any("embed_tokens" in k for k in adapter)
    # The base model on disk is untouched, and peft loads the adapter onto it directly.
    model = AutoPeftModelForCausalLM.from_pretrained(out)
    base = _base_state(tiny_model_dir)
    merged = model.merge_and_unload().state_dict()
    changed = [k for k in base if not torch.equal(base[k], merged[k])]
    assert changed, "the adapter should change the merged weights"


def test_pissa_adapter_applies_to_the_original_base(tiny_model_dir, tmp_path):
    """PiSSA rewrites the base weights while training; Gym saves the adapter converted back to plain
    LoRA, so original base + saved adapter == the model as trained."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from gym.config.finetuning import FinetuningArguments
    from gym.models.adapters import setup_adapter

    load = lambda: AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)  # noqa: E731
    model = setup_adapter(load(), FinetuningArguments(pissa_init=True, pissa_iter=-1, lora_rank=4))
    model.save_pretrained(tmp_path / "init")  # what run_causal_lm does before training
    with torch.no_grad():  # stand-in for training: move every adapter weight
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.add_(torch.randn_like(param) * 0.05)
    ids = torch.tensor([[5, 17, 99, 1000, 23]])
    with torch.no_grad():
        trained = model(ids).logits
    model.save_pretrained(tmp_path / "final", path_initial_model_for_weight_conversion=str(tmp_path / "init"))
    reloaded = PeftModel.from_pretrained(load(), tmp_path / "final").eval()
    with torch.no_grad():
        assert torch.allclose(reloaded(ids).logits, trained, atol=1e-4)


def test_full_finetuning_changes_all_weights(train_config, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    result = run_exp(train_config(finetuning_type="full", learning_rate=1e-3))
    trained = AutoModelForCausalLM.from_pretrained(result.output_dir).state_dict()
    base = _base_state(tiny_model_dir)
    unchanged = [k for k in base if torch.equal(base[k], trained[k]) and "norm" not in k]
    assert not unchanged, unchanged
    assert json.loads((Path(result.output_dir) / "gym_manifest.json").read_text())["what"] == "model"


def test_freeze_trains_only_the_last_layers(train_config, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    result = run_exp(train_config(finetuning_type="freeze", freeze_trainable_layers=1,
                                  freeze_trainable_modules="mlp", learning_rate=1e-3))
    trained = AutoModelForCausalLM.from_pretrained(result.output_dir).state_dict()
    base = _base_state(tiny_model_dir)
    changed = {k for k in base if not torch.equal(base[k], trained[k])}
    assert changed and all(k.startswith("model.layers.1.mlp.") for k in changed), changed


def test_loss_falls_and_log_and_plot_are_written(train_config):
    result = run_exp(train_config(max_steps=12, plot_loss=True, learning_rate=5e-3))
    out = Path(result.output_dir)
    log = [json.loads(line) for line in (out / "trainer_log.jsonl").read_text().splitlines()]
    losses = [e["loss"] for e in log if "loss" in e]
    assert len(losses) == 12 and min(losses[-3:]) < losses[0]
    assert all("tokens_per_second" in e for e in log if "loss" in e)
    assert (out / "training_loss.png").stat().st_size > 1000


def test_sharegpt_with_packing_and_eval_split(train_config):
    result = run_exp(train_config(dataset="tiny_chat,tiny_alpaca", packing=True, cutoff_len=128, val_size=4))
    assert "eval_loss" in result.metrics


def test_pt_stage_on_text(train_config, tiny_model_dir, data_dir, tokenizer):
    """Pre-training on raw text: the loss falls over training, and the trained model predicts the text
    better than the base does (measured here with transformers and peft, not with Gym)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    result = run_exp(train_config(stage="pt", dataset="tiny_text", cutoff_len=32, max_steps=10))
    assert result.global_step == 10
    log = [json.loads(line) for line in (Path(result.output_dir) / "trainer_log.jsonl").read_text().splitlines()]
    losses = [e["loss"] for e in log if "loss" in e]
    assert len(losses) == 10 and max(losses[-3:]) < losses[0]

    texts = [json.loads(line)["text"] for line in (data_dir / "text.jsonl").read_text().splitlines()]

    def text_loss(model) -> float:
        with torch.no_grad():
            return sum(model(input_ids=ids, labels=ids).loss.item()
                       for ids in (torch.tensor([tokenizer(t)["input_ids"]]) for t in texts)) / len(texts)

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    before = text_loss(base)
    trained = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), result.output_dir).eval()
    after = text_loss(trained)
    assert after < before - 0.3, (before, after)  # measured: 10.82 (about ln of the vocabulary) -> 10.16


def test_pt_stage_on_a_text_file(train_config, data_dir):
    """LLaMA-Factory's wiki_demo layout (a .txt named in dataset_info.json, one document per line) trains pt:
    every line is one example (20 short lines, batch 4, packing off so rows stay lines: 5 steps make an epoch),
    and the adapter moves."""
    lines = [f"Document {i}: the number {i} squared is {i * i}." for i in range(20)]
    (data_dir / "wiki_demo.txt").write_text("\n".join(lines[:10]) + "\n\n" + "\n".join(lines[10:]) + "\n")
    info = json.loads((data_dir / "dataset_info.json").read_text())
    info["wiki_demo"] = {"file_name": "wiki_demo.txt", "columns": {"prompt": "text"}}
    (data_dir / "dataset_info.json").write_text(json.dumps(info))
    result = run_exp(train_config(stage="pt", dataset="wiki_demo", cutoff_len=32, max_steps=-1, num_train_epochs=1,
                                    packing=False))
    assert result.global_step == 5 and result.final_loss is not None
    adapter = load_file(str(Path(result.output_dir) / "adapter_model.safetensors"))
    assert any(v.abs().sum() > 0 for k, v in adapter.items() if "lora_B" in k)


def test_gradient_checkpointing_with_lora_still_trains(train_config):
    result = run_exp(train_config(gradient_checkpointing=True))
    adapter = load_file(str(Path(result.output_dir) / "adapter_model.safetensors"))
    assert any(v.abs().sum() > 0 for k, v in adapter.items() if "lora_B" in k)


def test_continue_training_an_adapter(train_config, tmp_path):
    first = run_exp(train_config(output_dir=str(tmp_path / "a")))
    second = run_exp(train_config(output_dir=str(tmp_path / "b"), adapter_name_or_path=first.output_dir))
    a = load_file(str(Path(first.output_dir) / "adapter_model.safetensors"))
    b = load_file(str(Path(second.output_dir) / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and any(not torch.equal(a[k], b[k]) for k in a)


def test_refuses_to_overwrite_a_finished_model(train_config):
    from gym.core.errors import ConfigError

    run_exp(train_config())
    with pytest.raises(ConfigError, match="already holds a finished model"):
        run_exp(train_config())
    run_exp(train_config(overwrite_output_dir=True))


def test_a_diverged_run_reports_its_loss_as_nan_not_zero(train_config):
    # transformers logs a NaN loss as the mean of the finite ones in its window, 0 when none is: "final loss 0.0000".
    import math

    from gym.train.outputs import read_log
    from gym.workflows.training import run_exp

    result = run_exp(train_config(learning_rate=1e32, max_steps=3, logging_steps=1))
    losses = [e["loss"] for e in read_log(result.output_dir) if "loss" in e]
    assert math.isfinite(losses[0]) and math.isnan(losses[-1]) and math.isnan(result.final_loss)
    assert "the run diverged: lower learning_rate" in result.summary()
