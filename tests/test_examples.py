"""Every example in examples/ goes through the real config parser, and one of each family of trainers runs on the
embedded model, one short step each (quickstart.yaml: tests/test_e2e.py): dpo (orpo, simpo, cpo and tdpo are the
same trainer with another loss, each trained end to end on the tiny model in tests/train/test_dpo.py), kto, grpo
(gspo and rloo: tests/train/test_grpo.py, test_rloo.py), unlearn, QLoRA, OFT, long context, the cls guard;
rm_lora.yaml, whose reward model serves as the reward of ppo_lora.yaml; and the pt/sft ones, whose outputs are checked
against what their YAML asks for (which weights train, which LoRA variant)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from safetensors.torch import load_file

from gym.config.files import parse_cli_args
from gym.workflows.training import run_exp

REPO = Path(__file__).resolve().parent.parent
SHORT = {"max_steps": 1, "max_samples": 8, "cutoff_len": 160, "disable_tqdm": True, "save_strategy": "no",
         "dataset_dir": str(REPO / "data")}
ONLINE = {"max_completion_length": 16}
EXAMPLES = {"dpo_lora": {}, "kto_lora": {}, "grpo_lora": ONLINE, "unlearn_lora": {}, "qlora_sft": {}, "oft_sft": {},
            "sft_long_context": {}, "cls_guard": {}}


@pytest.mark.parametrize("path", [p for p in sorted((REPO / "examples").glob("*.yaml"))
                                  if p.stem != "tfgrpo_arithmetic"],  # gym tfgrpo's: run below
                         ids=lambda p: p.stem)
def test_every_example_is_a_valid_config(path):
    from gym.config.parser import get_train_args

    if path.stem == "tune_lora":  # a search space: gym tune reads its tune: block
        config = {k: v for k, v in parse_cli_args([str(path)]).items() if k != "tune"}
    else:
        config = parse_cli_args([str(path)])
    args = get_train_args({**config, "dataset_dir": str(REPO / "data")})
    assert args.finetuning.stage == config.get("stage", "sft")


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
def test_optimizer_example_trains_every_weight_with_galore(tmp_path, embedded_dir):
    result = _run("sft_full_optimizers", tmp_path / "galore")
    assert result.global_step == 1 and (Path(result.output_dir) / "model.safetensors").is_file()


@pytest.mark.slow
def test_tune_example_runs_a_trial(tmp_path, embedded_dir):
    from gym.tune.study import tune

    config = parse_cli_args([str(REPO / "examples" / "tune_lora.yaml")])
    config.update(SHORT, output_dir=str(tmp_path / "tune"), eval_steps=1)
    result = tune(config, trials=1)
    assert result.completed == 1 and result.best_config.is_file()


@pytest.mark.slow
def test_rm_example_is_the_reward_of_the_ppo_example(tmp_path, embedded_dir):
    rm = _run("rm_lora", tmp_path / "rm", val_size=0.0)
    assert json.loads((Path(rm.output_dir) / "adapter_config.json").read_text())["task_type"] == "SEQ_CLS"
    ppo = _run("ppo_lora", tmp_path / "ppo", reward_model=rm.output_dir, ppo_epochs=1, **ONLINE)
    out = Path(ppo.output_dir)
    assert (out / "value_head.safetensors").is_file() and (out / "adapter_model.safetensors").is_file()
    (entry,) = [json.loads(line) for line in (out / "trainer_log.jsonl").read_text().splitlines()]
    assert entry["reward"] != 0.0  # the reward model's score (plus accuracy and format) reached PPO


# -- the pt/sft examples -----------------------------------------------------------------------------
TRAINING_EXAMPLES = ["pt_lora", "sft_freeze", "sft_full", "sft_lora_variants"]
LINEAR_MODULES = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def _weights(folder: Path) -> dict:
    tensors = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def _changed(trained: dict, base: dict) -> set[str]:
    assert set(trained) == set(base)  # the whole model, under the base model's names
    return {name for name, tensor in trained.items() if not tensor.to(base[name].dtype).equal(base[name])}


def _check_lora(out: Path) -> dict:
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert adapter["peft_type"] == "LORA" and adapter["task_type"] == "CAUSAL_LM"
    tensors = load_file(out / "adapter_model.safetensors")
    lora_b = [t for name, t in tensors.items() if ".lora_B." in name]
    assert lora_b and all(t.abs().sum() > 0 for t in lora_b)  # B starts at zero: every adapter took the step
    assert not (out / "model.safetensors").exists()
    return adapter


def _check_pt_lora(out: Path, yaml: dict, base_dir: Path) -> None:
    adapter = _check_lora(out)
    from gym.config.finetuning import FinetuningArguments

    assert adapter["r"] == FinetuningArguments().lora_rank  # plain LoRA with the default rank
    assert not adapter["use_dora"] and not adapter["use_rslora"]


def _check_sft_lora_variants(out: Path, yaml: dict, base_dir: Path) -> None:
    adapter = _check_lora(out)
    assert adapter["use_dora"] is yaml["use_dora"] is True and adapter["use_rslora"] is yaml["use_rslora"] is True
    assert adapter["r"] == yaml["lora_rank"] == 16 and adapter["lora_alpha"] == 2 * yaml["lora_rank"]
    assert set(adapter["target_modules"]) == LINEAR_MODULES  # lora_target: all
    names = list(load_file(out / "adapter_model.safetensors"))
    assert any(name.endswith("lora_magnitude_vector") for name in names)  # DoRA's magnitudes were saved
    entries = [json.loads(line) for line in (out / "trainer_log.jsonl").read_text().splitlines()]
    assert any("eval_loss" in entry for entry in entries)  # val_size: the held-out split was evaluated


def _check_sft_freeze(out: Path, yaml: dict, base_dir: Path) -> None:
    assert not (out / "adapter_config.json").exists()
    num_layers = json.loads((base_dir / "config.json").read_text())["num_hidden_layers"]
    assert yaml["freeze_trainable_modules"] == "mlp"
    trainable = {f"model.layers.{layer}.mlp.{proj}.weight"
                 for layer in range(num_layers - yaml["freeze_trainable_layers"], num_layers)
                 for proj in ("gate_proj", "up_proj", "down_proj")}
    # exactly the MLPs of the last n layers moved; everything else is bit-for-bit the base model
    assert _changed(_weights(out), _weights(base_dir)) == trainable


def _check_sft_full(out: Path, yaml: dict, base_dir: Path) -> None:
    assert not (out / "adapter_config.json").exists()
    trained, base = _weights(out), _weights(base_dir)
    assert _changed(trained, base) == set(base)  # every weight trained, the embeddings and norms included


TRAINING_CHECKS = {"pt_lora": _check_pt_lora, "sft_freeze": _check_sft_freeze, "sft_full": _check_sft_full,
                   "sft_lora_variants": _check_sft_lora_variants}


@pytest.mark.slow
@pytest.mark.parametrize("name", TRAINING_EXAMPLES)
def test_training_example_runs_and_trains_what_it_says(name, tmp_path, embedded_dir):
    yaml = parse_cli_args([str(REPO / "examples" / f"{name}.yaml")])
    result = _run(name, tmp_path / name)
    out = Path(result.output_dir)
    assert result.global_step == 1 and out == tmp_path / name
    (first, *_) = [json.loads(line) for line in (out / "trainer_log.jsonl").read_text().splitlines()]
    assert first["step"] == 1 and math.isfinite(first["loss"]) and first["loss"] > 0
    assert (out / "training_loss.png").is_file() == bool(yaml.get("plot_loss"))
    weights = "adapter_model.safetensors" if yaml["finetuning_type"] == "lora" else "model.safetensors"
    assert (out / weights).is_file()
    TRAINING_CHECKS[name](out, yaml, embedded_dir)


@pytest.mark.slow
def test_tfgrpo_example_runs_on_the_embedded_model(tmp_path, embedded_dir, capsys):
    """examples/tfgrpo_arithmetic.yaml, shortened: one batch of 4 queries, groups of 2, short answers."""
    from gym.cli import main

    config = str(REPO / "examples" / "tfgrpo_arithmetic.yaml")
    short = [f"output_dir={tmp_path / 'tfgrpo'}", f"dataset_dir={REPO / 'data'}", "max_samples=6", "val_size=2",
             "batch_size=4", "group_size=2", "max_tokens=24", "update_max_tokens=24", "eval_samples=1",
             "max_parse_retries=0"]
    assert main(["tfgrpo", "train", config, *short]) == 0
    state = json.loads((tmp_path / "tfgrpo" / "tfgrpo_state.json").read_text())
    assert state["next"] == [1, 0] and len(state["history"]) == 1
    assert main(["tfgrpo", "eval", config, *short]) == 0
    assert "Mean@1" in capsys.readouterr().out
