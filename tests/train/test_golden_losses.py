"""Golden losses (torchtune's regression tests): five logged steps of sft, dpo and grpo on the tiny model, compared
with numbers recorded here at rtol 1e-4.

A run goes through the CLI with a YAML file, exactly as a user's does (`gym train cfg.yaml`), and its losses are
read back from the output folder's trainer_log.jsonl; nothing internal is called, so moving code around inside
Gym cannot break these tests, while a change to what a step computes (a loss formula, a default, the data order,
the LoRA init, the sampling of GRPO's answers) does.

Determinism: float32 only (`bf16: false` is written out, since Gym turns bf16 on by itself on CPUs with native
bf16 and a machine without it would then train at another precision), seed 0, the shipped demo data, and the
tiny Llama of tests/conftest.py (built from torch.manual_seed(0)). Checked identical across repeated runs and
with OMP_NUM_THREADS=1 against the default thread count.

When a change is meant to move these numbers (a new default, a newer transformers/TRL/peft that initialises or
reduces differently), rerun the test: the failure prints the new values ready to paste, and the commit that
pastes them says why they moved.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gym.cli import main

DATA = Path(__file__).resolve().parents[2] / "data"
RTOL = 1e-4

pytestmark = pytest.mark.slow  # ~4 s (sft) to ~11 s (dpo, grpo) each on 2 CPU cores

# Step 1 of dpo is ln 2 whatever the data: the LoRA adapter starts as a no-op, so policy == reference.
GOLDEN_LOSSES = {
    "sft": [10.797256469726562, 10.810754776000977, 10.794957160949707, 10.816669464111328, 10.778109550476074],
    "dpo": [0.6931471824645996, 0.6898279190063477, 0.6709507703781128, 0.6666226387023926, 0.6730215549468994],
}
# GRPO with beta 0 (the default) is on-policy: every probability ratio is 1 and a group's advantages sum to 0,
# so the logged loss is 0 up to float rounding at every step. What moves is the gradient (the loss formula's
# derivative) and the reward of the sampled answers (the seeded sampling), so those are the golden numbers.
GOLDEN_GRPO_REWARDS = [0.0833333358168602, 0.5, 0.1666666716337204, 0.25, 0.1666666716337204]
GOLDEN_GRPO_GRAD_NORMS = [0.2521021366119385, 0.3155940771102905, 0.28911149501800537, 0.33356988430023193, 0.0]

RUNS = {
    "sft": {"dataset": "alpaca_en_demo", "max_samples": 20, "cutoff_len": 64, "per_device_train_batch_size": 2,
            "learning_rate": 1e-3},
    "dpo": {"dataset": "dpo_en_demo", "max_samples": 20, "cutoff_len": 64, "per_device_train_batch_size": 2,
            "learning_rate": 1e-3},
    # A rule-based reward only (no reward model): the answer's correctness, and a length reward that the tiny
    # random model's 8-token answers earn different amounts of, so groups have non-zero advantages.
    "grpo": {"dataset": "arithmetic_demo", "max_samples": 20, "cutoff_len": 96, "per_device_train_batch_size": 4,
             "num_generations": 2, "max_completion_length": 8, "learning_rate": 5e-3,
             "reward_funcs": ["accuracy", "length:3"]},
}


def _train(stage: str, tiny_model_dir: Path, tmp_path: Path) -> list[dict]:
    """`gym train <yaml>` for five logged steps; the run's per-step log entries."""
    out = tmp_path / stage
    config = {"model_name_or_path": str(tiny_model_dir), "stage": stage, "finetuning_type": "lora",
              "dataset_dir": str(DATA), "output_dir": str(out), "max_steps": 5, "logging_steps": 1, "seed": 0,
              "bf16": False, "save_strategy": "no", "report_to": "none", "disable_tqdm": True, **RUNS[stage]}
    path = tmp_path / f"{stage}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    assert main(["train", str(path)]) == 0
    entries = [json.loads(line) for line in (out / "trainer_log.jsonl").read_text().splitlines()]
    steps = [e for e in entries if "loss" in e]  # the closing summary has train_loss, not loss
    assert [e["step"] for e in steps] == [1, 2, 3, 4, 5]
    return steps


def _assert_golden(name: str, actual: list[float], expected: list[float], abs_tol: float = 0.0) -> None:
    assert actual == pytest.approx(expected, rel=RTOL, abs=abs_tol), f"{name} moved; now: {actual!r}"


@pytest.mark.parametrize("stage", ["sft", "dpo"])
def test_first_five_losses(stage, tiny_model_dir, tmp_path):
    steps = _train(stage, tiny_model_dir, tmp_path)
    _assert_golden(f"{stage} losses", [e["loss"] for e in steps], GOLDEN_LOSSES[stage])


def test_grpo_first_five_steps(tiny_model_dir, tmp_path):
    steps = _train("grpo", tiny_model_dir, tmp_path)
    assert all(abs(e["loss"]) < 1e-6 for e in steps), [e["loss"] for e in steps]
    _assert_golden("grpo rewards", [e["reward"] for e in steps], GOLDEN_GRPO_REWARDS)
    # abs_tol for the last step, whose groups all tied (frac_reward_zero_std 1): no advantage, no gradient.
    _assert_golden("grpo grad norms", [e["grad_norm"] for e in steps], GOLDEN_GRPO_GRAD_NORMS, abs_tol=1e-7)
