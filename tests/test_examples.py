"""Every alignment example in examples/ runs on the embedded model (one short step each), and the
reward model that rm_lora.yaml trains serves as the reward of ppo_lora.yaml."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gym.config.files import parse_cli_args
from gym.train.run import run_exp

REPO = Path(__file__).resolve().parent.parent
SHORT = {"max_steps": 1, "max_samples": 8, "cutoff_len": 160, "disable_tqdm": True, "save_strategy": "no",
         "dataset_dir": str(REPO / "data")}
ONLINE = {"max_completion_length": 16}
EXAMPLES = {"dpo_lora": {}, "orpo_lora": {}, "simpo_lora": {}, "cpo_lora": {}, "kto_lora": {},
            "grpo_lora": ONLINE, "gspo_lora": ONLINE, "rloo_lora": ONLINE}


def _run(name: str, out: Path, **overrides):
    config = parse_cli_args([str(REPO / "examples" / f"{name}.yaml")])
    config.update(SHORT, output_dir=str(out), **overrides)
    return run_exp(config)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EXAMPLES))
def test_example_runs_on_the_embedded_model(name, tmp_path, embedded_dir):
    result = _run(name, tmp_path / name, **EXAMPLES[name])
    assert result.global_step == 1 and (Path(result.output_dir) / "adapter_model.safetensors").is_file()


@pytest.mark.slow
def test_rm_example_is_the_reward_of_the_ppo_example(tmp_path, embedded_dir):
    rm = _run("rm_lora", tmp_path / "rm", val_size=0.0)
    assert json.loads((Path(rm.output_dir) / "adapter_config.json").read_text())["task_type"] == "SEQ_CLS"
    ppo = _run("ppo_lora", tmp_path / "ppo", reward_model=rm.output_dir, ppo_epochs=1, **ONLINE)
    out = Path(ppo.output_dir)
    assert (out / "value_head.safetensors").is_file() and (out / "adapter_model.safetensors").is_file()
    (entry,) = [json.loads(line) for line in (out / "trainer_log.jsonl").read_text().splitlines()]
    assert entry["reward"] != 0.0  # the reward model's score (plus accuracy and format) reached PPO
