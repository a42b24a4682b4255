"""A soup made with a safety gate (`gym soup init ... --safety-gate SET`, DeltaSoupConfig.safety_gate) answers the
set with its base and with base + each contribution; a contribution whose harmful compliance rose is rejected with
the numbers, and the ledger keeps the decision either way. The model is scripted (tests/safety/scripted.py)."""

from __future__ import annotations

import pytest
import torch
from tests.safety.scripted import script_answers, write_set

from gym.cli import main
from gym.core.errors import ConfigError
from gym.soup import DeltaSoup, DeltaSoupConfig

UNSAFE = "model.layers.0.mlp.down_proj.weight"
HARMLESS = "model.layers.0.self_attn.q_proj.weight"


def delta(tiny_model_dir, name: str) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    shape = dict(AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters())[name].shape
    return {name: torch.full(shape, 0.01)}


def test_contributions_are_gated_and_the_ledger_keeps_the_numbers(tmp_path, tiny_model_dir, monkeypatch, capsys):
    calls = script_answers(monkeypatch, tiny_model_dir, tmp_path)
    gate_set = write_set(tmp_path)
    assert main(["soup", "init", str(tmp_path / "soup"), "--base", str(tiny_model_dir), "method=mean",
                 "min_contributors=1", "--safety-gate", gate_set, "--safety-max-rise", "0.1"]) == 0
    assert f"safety gate {gate_set}" in capsys.readouterr().out
    soup = DeltaSoup(path=tmp_path / "soup")
    assert soup.config.safety_gate == gate_set and soup.config.safety_max_rise == 0.1

    rejected = soup.contribute("mallory", delta(tiny_model_dir, UNSAFE))
    assert rejected.status == "rejected" and rejected.reason.startswith("Safety gate refused")
    assert "0.0% (0/10) for the base to 100.0% (10/10)" in rejected.reason
    assert rejected.info["safety_gate"]["decision"] == "refused"

    accepted = soup.contribute("alice", delta(tiny_model_dir, HARMLESS))
    assert accepted.accepted and accepted.info["safety_gate"]["decision"] == "passed"
    assert calls == [False, True, False]  # the base answered once: its answers are kept for the next contribution
    assert soup.contributions()[0].info["safety_gate"]["candidate_rate"] == 1.0  # read back from the ledger
    # the base is restored bit for bit after each check
    from transformers import AutoModelForCausalLM

    fresh = dict(AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters())
    assert all(torch.equal(p, fresh[n]) for n, p in soup.base.model.named_parameters())


def test_bad_gate_settings_fail_at_init(tmp_path, tiny_model_dir, capsys):
    with pytest.raises(ConfigError, match="share of the harmful requests"):
        DeltaSoupConfig(safety_gate="safety_demo", safety_max_rise=2.0)
    with pytest.raises(ConfigError, match="safety_max_new_tokens must be a whole number"):
        DeltaSoupConfig(safety_gate="safety_demo", safety_max_new_tokens="x")
    assert main(["soup", "init", str(tmp_path / "s"), "--base", str(tiny_model_dir), "--safety-judge", "x"]) == 2
    assert "give --safety-gate SET too" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()
