"""Kill training with SIGKILL mid-run, resume from the last checkpoint, and land on the same final
loss as a run that was never interrupted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from gym.train.checkpoints import last_checkpoint
from gym.workflows.training import run_exp


def _final_loss(output_dir: Path) -> float:
    log = [json.loads(line) for line in (output_dir / "trainer_log.jsonl").read_text().splitlines()]
    steps = [e["step"] for e in log if "loss" in e]
    assert steps == sorted(set(steps)), "the resumed log should read as one run"
    return [e["loss"] for e in log if "loss" in e][-1]


def test_sigkill_then_resume_reaches_the_same_loss(train_config, tmp_path):
    max_steps = 40
    common = dict(max_steps=max_steps, save_strategy="steps", save_steps=5, learning_rate=5e-3, lora_dropout=0.1)

    reference = run_exp(train_config(output_dir=str(tmp_path / "reference"), **common))

    interrupted = tmp_path / "interrupted"
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(train_config(output_dir=str(interrupted), **common)))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "gym.cli", "train", str(cfg)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        found = last_checkpoint(interrupted)
        if found is not None and int(found.name.split("-")[1]) >= 10:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "training finished before it could be killed"
    assert not (interrupted / "gym_manifest.json").exists()
    killed_at = int(last_checkpoint(interrupted).name.split("-")[1])
    assert killed_at < max_steps

    resumed = run_exp(train_config(output_dir=str(interrupted), resume_from_checkpoint=True, **common))
    assert resumed.global_step == max_steps
    assert abs(_final_loss(interrupted) - _final_loss(Path(reference.output_dir))) < 1e-4


def test_resume_without_checkpoint_is_a_clear_error(train_config):
    import pytest

    from gym.core.errors import ConfigError

    with pytest.raises(ConfigError, match="no complete checkpoint"):
        run_exp(train_config(resume_from_checkpoint=True))


def test_incomplete_checkpoint_is_skipped(tmp_path):
    (tmp_path / "checkpoint-5").mkdir()
    (tmp_path / "checkpoint-5" / "trainer_state.json").write_text("{}")
    (tmp_path / "checkpoint-10").mkdir()  # killed while saving: no trainer_state.json yet
    (tmp_path / "checkpoint-15").mkdir()
    (tmp_path / "checkpoint-15" / "trainer_state.json").write_text('{"global_st')  # cut short
    assert last_checkpoint(tmp_path).name == "checkpoint-5"


def test_a_damaged_checkpoint_file_is_named_before_the_model_loads(train_config):
    # A truncated optimizer.pt or rng_state.pth was a torch traceback on resume, after the model had loaded.
    import pytest

    from gym.core.errors import ConfigError

    config = train_config(save_strategy="steps", save_steps=1)
    out = Path(run_exp(config).output_dir)
    for name in ("optimizer.pt", "rng_state.pth", "adapter_model.safetensors"):
        damaged = out / "checkpoint-2" / name
        whole = damaged.read_bytes()
        damaged.write_bytes(whole[: len(whole) // 2])
        expected = (rf"{name} is damaged or incomplete .* checkpoint-2 cannot be resumed: resume from the one before "
                    rf"\(resume_from_checkpoint: .*checkpoint-1\)")
        with pytest.raises(ConfigError, match=expected):
            run_exp({**config, "max_steps": 5, "resume_from_checkpoint": str(out / "checkpoint-2")})
        damaged.write_bytes(whole)
    assert run_exp({**config, "max_steps": 4, "resume_from_checkpoint": str(out / "checkpoint-2")}).global_step == 4


def test_gyms_own_checkpoint_cut_short_is_named(tmp_path):
    # PPO's loop reads trainable.safetensors itself (gym.train.checkpoints), before the optimizer and the rest.
    import pytest
    import torch
    from safetensors.torch import save_file

    from gym.core.errors import ModelError
    from gym.train.checkpoints import WEIGHTS_FILE, load_checkpoint

    weights = tmp_path / WEIGHTS_FILE
    save_file({"w": torch.ones(64, 64)}, str(weights))
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ModelError, match=rf"^{weights} is damaged or incomplete"):
        load_checkpoint(tmp_path, {}, None, None, torch.Generator())  # type: ignore[arg-type]
