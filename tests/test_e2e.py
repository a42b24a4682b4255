"""The quick start on the real embedded model, shortened to a few steps."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_quickstart_trains_the_embedded_model_and_chats(tmp_path, embedded_dir):
    out = tmp_path / "quickstart"
    train = subprocess.run(
        [sys.executable, "-m", "gym.cli", "train", "examples/quickstart.yaml", "max_steps=2", "max_samples=8",
         "cutoff_len=128", f"output_dir={out}", "disable_tqdm=true"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert train.returncode == 0, train.stderr[-3000:]
    assert "Done: 2 steps" in train.stdout
    assert (out / "adapter_model.safetensors").is_file() and (out / "training_loss.png").is_file()
    chat = subprocess.run(
        [sys.executable, "-m", "gym.cli", "chat", "examples/quickstart.yaml", f"output_dir={out}",
         "max_new_tokens=12", "do_sample=false", "--prompt", "What is the capital of France?"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert chat.returncode == 0, chat.stderr[-3000:]
    answer = chat.stdout.split("Assistant:", 1)[1]
    assert len(answer.strip()) > 0
