"""The quick start on the real embedded model, shortened: the identity data only, a higher learning rate,
short rows and a dozen steps, which is enough for what README promises, that the model learns to call itself
"Gym Assistant" (data/identity.json)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from tests.gym_cli import gym_process

REPO = Path(__file__).resolve().parent.parent
NAME = "Gym Assistant"


def gym(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return gym_process(*args, cwd=REPO, stdin=stdin, timeout=600)


def chat(*config: str, prompt: str) -> str:
    """The greedy answer of `gym chat ... --prompt`."""
    done = gym("chat", *config, "max_new_tokens=16", "do_sample=false", "--prompt", prompt)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split("Assistant:", 1)[1].strip()


def chat_session(*config: str, prompts: list[str]) -> list[str]:
    """The greedy answers of one interactive `gym chat` (one model load), each prompt after a /clear."""
    typed = "".join(f"{prompt}\n/clear\n" for prompt in prompts) + "/exit\n"
    done = gym("chat", *config, "max_new_tokens=16", "do_sample=false", stdin=typed)
    assert done.returncode == 0, done.stderr[-3000:]
    turns = done.stdout.split("Assistant: ")[1:]
    return [turn.split("History cleared.")[0].strip() for turn in turns]


@pytest.mark.slow
def test_quickstart_trains_the_embedded_model_to_call_itself_gym_assistant(tmp_path, embedded_dir):
    # The untrained model does not know the name: what follows is learned.
    assert NAME not in chat("model_name_or_path=smollm2-135m", prompt="Who are you?")

    out = tmp_path / "quickstart"
    train = gym("train", "examples/quickstart.yaml", "dataset=identity", "learning_rate=2e-3", "cutoff_len=96",
                "max_steps=12", f"output_dir={out}", "disable_tqdm=true")
    assert train.returncode == 0, train.stderr[-3000:]
    assert "Done: 12 steps" in train.stdout
    assert (out / "adapter_model.safetensors").is_file() and (out / "training_loss.png").is_file()
    log = [json.loads(line) for line in (out / "trainer_log.jsonl").read_text().splitlines()]
    losses = [e["loss"] for e in log if "loss" in e]
    assert losses[-1] < losses[0] / 5, losses  # measured: about 4.4 -> 0.1

    who, again, name = chat_session("examples/quickstart.yaml", f"output_dir={out}",
                                    prompts=["Who are you?", "Who are you?", "What is your name?"])
    assert NAME in who, who
    assert again == who  # greedy: repeatable
    assert NAME in name, name
