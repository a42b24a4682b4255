"""stage: kto on the tiny model: two steps train only the LoRA adapter against the adapter-disabled base (also at
per_device_train_batch_size 1, as LLaMA-Factory's example runs it), the first loss is the closed form of the KTO
objective when policy == reference, and every KL pair holds another row's answer."""

from __future__ import annotations

from pathlib import Path

import pytest

from gym.core.errors import ConfigError
from gym.train.harness import read_log
from gym.train.methods import kto
from gym.workflows.training import run_exp


def test_two_steps_train_only_the_adapter(feedback_config, capture_trainer, assert_only_adapter_trained):
    captured = capture_trainer(kto)
    result = run_exp(feedback_config())
    assert result.global_step == 2
    assert_only_adapter_trained(Path(result.output_dir))
    trainer = captured["trainer"]
    assert trainer.ref_model is None and set(trainer.model.peft_config) == {"default"}
    assert trainer.calculate_KL  # the reference point is estimated from mismatched pairs


def test_first_loss_is_the_weighted_closed_form(feedback_config):
    # policy == reference: every log-ratio and the KL estimate are 0, so each example's loss is
    # 1 - sigmoid(0) = 0.5, times its weight; the batch holds all 16 rows, 8 of each kind.
    result = run_exp(feedback_config(per_device_train_batch_size=16, max_steps=1, kto_chosen_weight=2.0,
                                     kto_rejected_weight=1.0))
    (first,) = [e for e in read_log(result.output_dir) if e.get("step") == 1 and "loss" in e]
    assert first["loss"] == pytest.approx(0.5 * (2.0 * 8 + 1.0 * 8) / 16, abs=1e-5)
    assert first["kl"] == pytest.approx(0.0, abs=1e-6)


def test_kl_pairs_take_another_rows_answer_at_batch_size_one():
    """Each prompt's KL answer is the previous row's (the first row's, the last row's): what TRL's collator builds for
    a batch of one row is that row's prompt with another row's answer, never its own. Answers are cut to fit
    cutoff_len after the prompt, as the rows themselves are."""
    from trl.trainer.kto_trainer import DataCollatorForUnpairedPreference

    rows = [{"prompt_ids": [1, 1], "completion_ids": [10, 11, 12], "label": True},
            {"prompt_ids": [2], "completion_ids": [20], "label": False},
            {"prompt_ids": [3, 3, 3], "completion_ids": [30, 31], "label": True}]
    paired = kto.with_kl_answers(rows, cutoff_len=5)
    assert [r["KL_completion_ids"] for r in paired] == [[30, 31], [10, 11, 12], [20]]
    collate = DataCollatorForUnpairedPreference(pad_token_id=0)
    for i, row in enumerate(paired):
        batch = collate([row])  # per_device_train_batch_size: 1
        assert batch["input_ids"].tolist() == [rows[i]["prompt_ids"] + rows[i]["completion_ids"]]
        assert batch["KL_input_ids"].tolist() == [rows[i]["prompt_ids"] + rows[i - 1]["completion_ids"]]
    assert kto.with_kl_answers(rows, cutoff_len=4)[0]["KL_completion_ids"] == [30, 31]
    assert kto.with_kl_answers(rows, cutoff_len=4)[1]["KL_completion_ids"] == [10, 11, 12]
    assert kto.with_kl_answers(rows, cutoff_len=4)[2]["KL_completion_ids"] == [20]
    assert kto.with_kl_answers(rows, cutoff_len=3)[1]["KL_completion_ids"] == [10, 11]


def test_batch_size_one_with_accumulation_trains(feedback_config, capture_trainer, assert_only_adapter_trained):
    """LLaMA-Factory's KTO example: per_device_train_batch_size 1, gradient_accumulation_steps 8 (4 here). It trains
    the adapter with finite losses and KL estimates, on batches of one row whose KL pair is another row's answer."""
    import math

    captured = capture_trainer(kto)
    result = run_exp(feedback_config(per_device_train_batch_size=1, gradient_accumulation_steps=4, max_steps=2))
    assert result.global_step == 2
    assert_only_adapter_trained(Path(result.output_dir))
    logged = [e for e in read_log(result.output_dir) if "loss" in e]
    assert len(logged) == 2 and all(math.isfinite(e["loss"]) and math.isfinite(e["kl"]) for e in logged)
    trainer = captured["trainer"]
    assert trainer.args.per_device_train_batch_size == 1 and trainer.calculate_KL
    order = trainer.train_dataset
    for i, batch in zip(range(8), trainer.get_train_dataloader(), strict=False):
        prompt, own, previous = order[i]["prompt_ids"], order[i]["completion_ids"], order[i - 1]["completion_ids"]
        assert batch["input_ids"].tolist() == [prompt + own]
        assert batch["KL_input_ids"].tolist() == [prompt + previous]


@pytest.mark.parametrize(("overrides", "match"), [
    ({"pref_ftx": 0.5}, "'pref_ftx' is not supported by kto"),
    ({"pref_beta": 0.0}, "'pref_beta' must be positive"),
])
def test_config_errors(feedback_config, overrides, match):
    with pytest.raises(ConfigError, match=match):
        run_exp(feedback_config(**overrides))
