"""Stop on request: the first SIGINT (Ctrl-C, or the web UI's Stop) finishes the step, saves a checkpoint and
ends the run with RunStopped, leaving no finished model; resuming continues from that checkpoint."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from transformers import TrainerCallback

from gym.core.errors import RunStopped
from gym.core.files import MANIFEST_FILE
from gym.train import harness
from gym.train.methods import ppo
from gym.train.stopping import StopRequest, stop_on_interrupt
from gym.workflows.training import run_exp


@pytest.fixture()
def ppo_config(prompt_config):
    def make(**overrides):
        return prompt_config(**{"stage": "ppo", "per_device_train_batch_size": 2, "ppo_buffer_size": 2,
                                "ppo_epochs": 1, **overrides})

    return make


class InterruptAt(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGINT)


def test_sft_stops_with_a_checkpoint_and_resumes_from_it(train_config):
    config = train_config(max_steps=6, logging_steps=1, save_strategy="no")
    handler = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN where pytest was started in the background
    with harness.extra_callbacks(InterruptAt(2)), pytest.raises(RunStopped, match=r"step 3 of 6.*checkpoint-3"):
        run_exp(config)
    out = Path(config["output_dir"])
    assert (out / "checkpoint-3" / "trainer_state.json").is_file()  # saved though save_strategy is "no"
    assert not (out / MANIFEST_FILE).exists()  # not a finished model
    assert signal.getsignal(signal.SIGINT) is handler  # the handler is given back

    result = run_exp({**config, "resume_from_checkpoint": True})
    assert result.global_step == 6 and (out / MANIFEST_FILE).is_file()
    steps = [json.loads(line)["step"] for line in (out / "trainer_log.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6, 6]  # the last: the closing summary


def test_ppo_stops_with_a_checkpoint_of_its_own_loop(ppo_config, monkeypatch):
    original = ppo.collect_rollout
    calls = []

    def rollout_then_interrupt(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGINT)
        return original(*args, **kwargs)

    monkeypatch.setattr(ppo, "collect_rollout", rollout_then_interrupt)
    config = ppo_config(max_steps=3)
    with pytest.raises(RunStopped, match="step 1 of 3"):
        run_exp(config)
    out = Path(config["output_dir"])
    assert json.loads((out / "checkpoint-1" / "trainer_state.json").read_text())["global_step"] == 1
    assert not (out / MANIFEST_FILE).exists()
    monkeypatch.setattr(ppo, "collect_rollout", original)
    assert run_exp({**config, "resume_from_checkpoint": True}).global_step == 3


def test_a_second_interrupt_quits_at_once():
    with stop_on_interrupt() as request:
        os.kill(os.getpid(), signal.SIGINT)
        assert request.requested
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert not StopRequest().requested
