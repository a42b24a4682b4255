"""The row preview is training's own encoding (what the loss is on, marked), and the estimate's formula counts the
parameters the real model has; a dry run's numbers are read from its log and summary."""

from __future__ import annotations

import json

import pytest

from gym.webui import estimate, preview


def test_the_preview_marks_exactly_the_tokens_the_loss_is_on(tiny_model_dir, data_dir):
    from gym.data.loader import load_examples
    from gym.data.processors import IGNORE_INDEX, encode_supervised
    from gym.data.registry import get_dataset_attrs

    shown = preview.preview_rows(str(tiny_model_dir), "tiny_alpaca", str(data_dir), "sft", rows=1)
    segments = shown.segments
    assert shown.images == []  # a text dataset has no pictures to show
    trained = "".join(text for text, label in segments if label == "trained")
    chat, media = preview._model(str(tiny_model_dir), None)
    assert media is None
    example = load_examples(get_dataset_attrs("tiny_alpaca", data_dir)[0], "supervised", max_samples=1)[0]
    row = encode_supervised(example, chat, 2048)
    labels = [t for t in row["labels"] if t != IGNORE_INDEX]
    assert trained == chat.tokenizer.decode(labels) and "0 + 1 = 1." in trained
    prompt = "".join(text for text, label in segments if label == "prompt")
    assert "Add 0 and 1." in prompt and "Add 0 and 1." not in trained


def test_the_preview_of_preference_rows_shows_both_answers(tiny_model_dir):
    from pathlib import Path

    data = Path(__file__).resolve().parents[2] / "data"
    shown = preview.preview_rows(str(tiny_model_dir), "dpo_en_demo", str(data), "dpo", rows=1)
    labels = {label for _, label in shown.segments}
    assert {"prompt", "chosen", "rejected"} <= labels


def test_the_formula_counts_the_real_models_parameters(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from gym.config.parser import get_train_args
    from gym.models.adapters import count_parameters, setup_finetuning

    config = {"model_name_or_path": str(tiny_model_dir), "stage": "sft", "finetuning_type": "lora", "lora_rank": 4,
              "dataset": "identity", "output_dir": "out", "cutoff_len": 64, "per_device_train_batch_size": 2,
              "bf16": False}
    real = setup_finetuning(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                            get_train_args(dict(config)).finetuning)
    trainable, total = count_parameters(real)
    guess = estimate.formula(config)
    assert guess.how == "formula" and guess.parts["gradients"] == trainable * 4
    assert guess.parts["weights"] == total * 4 and guess.memory_bytes == sum(guess.parts.values())
    mixed = estimate.formula({**config, "bf16": True})  # the frozen base in bf16, the adapter float32
    assert mixed.parts["weights"] == (total - trainable) * 2 + trainable * 4
    full = estimate.formula({**config, "finetuning_type": "full", "stage": "dpo"})
    assert full.parts["gradients"] == full.parts["reference model"] == (total - trainable) * 4  # the base, whole


def test_a_dry_runs_numbers_come_from_its_log_and_summary(tmp_path):
    lines = [{"step": s, "loss": 1.0, "elapsed_s": t} for s, t in ((1, 5.0), (2, 5.5), (3, 6.1))]
    (tmp_path / "trainer_log.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    measured = estimate.measured(str(tmp_path), "Done: 3 steps in 6 s, final loss 1.0, 9 tokens/s, "
                                                "peak memory 1.50 GiB.")
    assert measured.seconds_per_step == pytest.approx(0.55) and measured.memory_bytes == int(1.5 * 2**30)
    assert "measured" in measured.table()
