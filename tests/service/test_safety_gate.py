"""A server's safety gate (`gym api --variants STORE --safety-gate SET`) reaches every fine-tuning job: a job whose
variant's harmful compliance rose fails with code safety_gate_refused and the numbers, and publishes nothing; one
that passes records the decision. The model is scripted (tests/safety/scripted.py)."""

from __future__ import annotations

import pytest
from tests.safety.scripted import script_answers, write_set
from tests.service.test_jobs import QUESTIONS, Events, chat_row, tiny_spec, write_jsonl

from gym.core.errors import ConfigError, DataError
from gym.personalization.store import VariantStore
from gym.serve.cli import safety_gate_option
from gym.service.jobs import JobSpec, JobStatus, run_job


def gated_spec(tmp_path, tiny_model_dir, target: str) -> JobSpec:
    file = write_jsonl(tmp_path / "train.jsonl", [chat_row(q) for q in QUESTIONS[:10]])
    return tiny_spec(tiny_model_dir, file, safety_gate={"dataset": write_set(tmp_path), "max_rise": 0.1},
                     training={"cutoff_len": 64, "max_steps": 2, "lora_target": target})


def test_a_job_whose_variant_is_less_safe_fails_with_the_numbers(tmp_path, tiny_model_dir, monkeypatch):
    script_answers(monkeypatch, tiny_model_dir, tmp_path)
    events = Events()
    spec = gated_spec(tmp_path, tiny_model_dir, "down_proj")
    result = run_job(spec, tmp_path / "store", tmp_path / "work", events)
    assert result.status is JobStatus.FAILED and result.fine_tuned_model is None
    assert result.error["code"] == "safety_gate_refused" and result.error["param"] is None
    assert "0.0% (0/10) for the base to 100.0% (10/10)" in result.error["message"]
    last = events.seen[-1]
    assert last["level"] == "error" and last["data"]["safety_gate"]["decision"] == "refused"
    assert VariantStore(tmp_path / "store").users() == []


def test_a_job_that_passes_the_gate_publishes_with_the_decision(tmp_path, tiny_model_dir, monkeypatch):
    script_answers(monkeypatch, tiny_model_dir, tmp_path)
    events = Events()
    spec = gated_spec(tmp_path, tiny_model_dir, "q_proj")
    assert JobSpec(**spec.to_dict()).safety_gate == spec.safety_gate  # through the queue's JSON as it is
    result = run_job(spec, tmp_path / "store", tmp_path / "work", events)
    assert result.status is JobStatus.SUCCEEDED, result.error
    passed = next(e for e in events.seen if e["message"].startswith("Safety gate passed"))
    assert passed["data"]["safety_gate"]["rise"] == 0.0
    assert VariantStore(tmp_path / "store").get(spec.variant).safety_gate["decision"] == "passed"


def test_the_servers_flags(tmp_path):
    gate_set = write_set(tmp_path)
    assert safety_gate_option(None, None, None) is None
    assert safety_gate_option(gate_set, "refusal", "0.1") == {"dataset": gate_set, "judge": "refusal",
                                                              "max_rise": 0.1}
    with pytest.raises(ConfigError, match="give --safety-gate SET"):
        safety_gate_option(None, None, "0.1")
    with pytest.raises(ConfigError, match="--safety-max-rise takes a share"):
        safety_gate_option(gate_set, None, "lots")
    with pytest.raises(ConfigError, match="Unknown safety gate option"):
        JobSpec(**{**tiny_spec(tmp_path, "f.jsonl").to_dict(), "safety_gate": {"dataset": "x", "rise": 1}})


def test_job_options_gate_is_checked_when_the_server_starts(tmp_path):
    # --safety-gate's set and judge were checked at start, the same gate in --job_options only when each job ran.
    from gym.service.jobs import check_job_options

    gate_set = write_set(tmp_path)
    check_job_options({"safety_gate": {"dataset": gate_set}})
    with pytest.raises(DataError, match="not found"):
        check_job_options({"safety_gate": {"dataset": str(tmp_path / "missing.json")}})
    with pytest.raises(ConfigError, match="Did you mean 'refusal'"):
        check_job_options({"safety_gate": {"dataset": gate_set, "judge": "refusals"}})
    with pytest.raises(ConfigError, match="Unknown safety gate option.*: judg. Did you mean 'judge'"):
        check_job_options({"safety_gate": {"dataset": gate_set, "judg": "refusal"}})
