"""PersonalizedTrainer end to end on the embedded model: a user's rows -> a stored 1-bit variant that
answers as the model `gym delta apply` rebuilds from it; the CLI over the same store."""

from __future__ import annotations

import pytest
import torch

from gym.cli import main as cli_main
from gym.delta.bitdelta import BitDeltaConfig
from gym.personalization import PersonalizedTrainer

ROWS = [{"instruction": f"What is the secret word number {i}?", "output": f"The secret word is banana-{i % 3}."}
        for i in range(12)]


@pytest.mark.slow
def test_a_variant_is_trained_stored_served_and_managed(tmp_path, embedded_dir, capsys):
    store = tmp_path / "variants"
    trainer = PersonalizedTrainer("smollm2-135m", BitDeltaConfig(distill_steps=2, calibration="user-rows"),
                                  store=store)
    record = trainer.create_variant("alice", data=ROWS, max_steps=4)
    parameters = record.base["parameters"]
    assert 0 < record.bytes < parameters * 4 / 16  # 1 bit a weight plus scales: far under float32's 32
    assert record.gain_kept is not None and record.losses["finetuned"] < record.losses["base"]
    assert [r.user for r in trainer.list_variants()] == ["alice"]

    # The oracle: the served variant equals the full model `gym delta apply` writes.
    exported = tmp_path / "alice-model"
    assert cli_main(["variants", "export", str(store), "--user", "alice", "-o", str(exported)]) == 0
    from transformers import AutoModelForCausalLM

    full = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32).eval()
    chat = trainer.serve_variant("alice")
    try:
        ids = torch.tensor([chat.render([{"role": "user", "content": "What is the secret word number 5?"}])])
        with torch.no_grad():
            assert torch.allclose(chat.model(ids).logits, full(ids).logits, atol=1e-4)
            expected = full.generate(ids, max_new_tokens=10, do_sample=False)[0, ids.shape[1]:]
        answer = chat.chat([{"role": "user", "content": "What is the secret word number 5?"}], max_new_tokens=10,
                           do_sample=False)
    finally:
        chat.close()
    assert answer == chat.tokenizer.decode(expected, skip_special_tokens=True).strip() or answer in \
        chat.tokenizer.decode(expected, skip_special_tokens=True)

    # `gym export --variant STORE:USER`: the variant as it is served (base + its 1-bit delta), in any export format.
    from gym.delta.apply import write_applied
    from gym.personalization.store import VariantStore

    assert cli_main(["export", "--variant", f"{store}:alice", "--export_dir", str(tmp_path / "alice-hf")]) == 0
    rebuilt = write_applied("smollm2-135m", VariantStore(store).delta_path("alice"), tmp_path / "applied")
    a = AutoModelForCausalLM.from_pretrained(tmp_path / "alice-hf").state_dict()
    b = AutoModelForCausalLM.from_pretrained(rebuilt).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in b)
    assert cli_main(["export", "--variant", f"{store}:bob", "--export_dir", str(tmp_path / "bob")]) == 2

    capsys.readouterr()
    assert cli_main(["variants", "list", str(store)]) == 0
    assert capsys.readouterr().out.startswith("alice\t")
    assert cli_main(["variants", "delete", str(store), "--user", "../alice"]) == 2  # a path, not a user id
    assert "user id" in capsys.readouterr().err
    assert cli_main(["variants", "delete", str(store), "--user", "alice"]) == 0
    assert trainer.list_variants() == []


def test_create_needs_exactly_one_kind_of_data(tmp_path):
    from gym.core.errors import ConfigError

    trainer = PersonalizedTrainer("smollm2-135m", store=tmp_path)
    with pytest.raises(ConfigError, match="exactly one"):
        trainer.create_variant("alice")
    with pytest.raises(ConfigError, match="user id"):
        trainer.create_variant("../x", data=ROWS)


def test_a_misspelt_training_key_is_refused_at_construction_with_the_closest(tmp_path):
    from gym.core.errors import ConfigError

    with pytest.raises(ConfigError, match="Unknown config key 'learnig_rate'. Did you mean 'learning_rate'?"):
        PersonalizedTrainer("smollm2-135m", store=tmp_path / "variants", learnig_rate=1e-4)
    trainer = PersonalizedTrainer("smollm2-135m", store=tmp_path / "variants", learning_rate=1e-4)
    with pytest.raises(ConfigError, match="Did you mean 'max_steps'?"):  # create_variant's own, before any work
        trainer.create_variant("alice", data=ROWS, max_stpes=3)
    assert not (tmp_path / "variants").exists()  # refused before the store made a folder for the variant


def test_a_key_each_variant_sets_itself_is_refused_not_silently_replaced(tmp_path):
    # output_dir=..., stage="dpo" or model_name_or_path=... were accepted and then replaced by create_variant's own.
    from gym.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"Training key output_dir is set for each variant \(.*work_dir=\); remove"):
        PersonalizedTrainer("smollm2-135m", store=tmp_path / "variants", output_dir=str(tmp_path / "runs"))
    trainer = PersonalizedTrainer("smollm2-135m", store=tmp_path / "variants")
    with pytest.raises(ConfigError, match=r"Training key stage is set for each variant \(sft for data="):
        trainer.create_variant("alice", data=ROWS, stage="dpo")
    assert not (tmp_path / "variants").exists()
