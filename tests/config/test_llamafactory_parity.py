"""LLaMA-Factory parity: Gym's fixtures in tests/fixtures/llamafactory/ carry every key of LLaMA-Factory's shipped
example configs (examples/train_lora, train_qlora, train_full, extras; v0.9.6.dev0), one fixture per example, on
the local test model and Gym's demo data. Each parses; those this machine can run train one step; the rest fail
with a config error that says why (docs/training.md has the table)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gym.config.aliases import KEY_ALIASES
from gym.config.parser import get_train_args, known_keys
from gym.config.unsupported import ONE_WAY, READ_ELSEWHERE, UNSUPPORTED
from gym.core.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "llamafactory"
ALL = sorted(str(p.relative_to(FIXTURES)) for p in FIXTURES.rglob("*.yaml"))

# fixture -> what its config error says (everything else trains here)
REFUSED = {
    "extras/asft/llama2_full_asft.yaml": "'use_asft_loss' .* Anchored SFT",
    "extras/asft/qwen2_full_asft.yaml": "'use_asft_loss' .* Anchored SFT",
    "extras/eaft/qwen25_05b_eaft_full.yaml": "'use_eaft_loss' .* EAFT loss is not implemented",
    "extras/fp8/llama3_fp8_deepspeed_sft.yaml": "'fp8' .* needs a Hopper-or-newer CUDA GPU",
    "extras/fp8/llama3_fp8_fsdp_sft.yaml": "'fp8' .* needs a Hopper-or-newer CUDA GPU",
    "extras/mod/llama3_full_sft.yaml": "'mixture_of_depths' .* transformers 4",
    "extras/nlg_eval/llama3_lora_predict.yaml": "gym infer",
    "train_full/mossvl_full_sft.yaml": "'deepspeed' runs in processes started by a launcher",
    "train_full/qwen3_full_sft.yaml": "'deepspeed' runs in processes started by a launcher",
    "train_full/qwen3vl_full_sft.yaml": "'deepspeed' runs in processes started by a launcher",
    "train_lora/qwen3_lora_sft_ds3.yaml": "'deepspeed' runs in processes started by a launcher",
    "train_lora/qwen3_lora_sft_ray.yaml": "'ray_num_workers' is read when Ray runs the training: `USE_RAY=1 gym train",
    "train_lora/qwen3_preprocess.yaml": "'tokenized_path' .* keeps no tokenized copy",
}


def _config(name: str, model_dir: Path, out: Path) -> dict:
    config = yaml.safe_load((FIXTURES / name).read_text())
    config.update(model_name_or_path=str(model_dir), dataset_dir=str(REPO / "data"), output_dir=str(out),
                  max_steps=1, save_strategy="no", disable_tqdm=True)
    if "deepspeed" in config:
        config["deepspeed"] = str(REPO / config["deepspeed"])
    return config


def test_the_fixtures_cover_llamafactorys_examples():
    assert len(ALL) == 41 and set(REFUSED) <= set(ALL)
    accepted = set(known_keys()) | set(KEY_ALIASES) | set(UNSUPPORTED) | set(READ_ELSEWHERE) | set(ONE_WAY)
    for name in ALL:
        keys = set(yaml.safe_load((FIXTURES / name).read_text()))
        assert keys <= accepted, (name, keys - accepted)  # no key meets "Unknown config key"


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_what_cannot_run_here_is_refused_with_the_reason(name, tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match=REFUSED[name]):
        get_train_args(_config(name, tiny_model_dir, tmp_path / "out"))


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in ALL if n not in REFUSED])
def test_what_runs_here_trains_one_step(name, tiny_model_dir, tmp_path):
    from gym.workflows.training import run_exp

    result = run_exp(_config(name, tiny_model_dir, tmp_path / "out"))
    out = Path(result.output_dir)
    assert result.global_step == 1
    assert (out / "adapter_model.safetensors").is_file() or (out / "model.safetensors").is_file()


@pytest.mark.parametrize(("key", "on", "reason"), [
    ("resize_vocab", True, "does not add tokens"),
    ("new_special_tokens", "<think>,</think>", "does not add tokens"),
    ("add_tokens", ["foo", "bar"], "does not add tokens"),
    ("add_special_tokens", "<tool>", "does not add tokens"),
    ("split_special_tokens", "true", "read each as one token"),
    ("compute_accuracy", True, "token accuracy at evaluation is not computed"),
    ("create_new_adapter", True, "merge them first"),
    ("low_cpu_mem_usage", False, "always loads weights straight into place"),
])
def test_llamafactory_keys_gym_runs_one_way(key, on, reason):
    """These met "Unknown config key": the value Gym runs with is accepted as written in a pasted config, the other
    refused with the reason."""
    off = ONE_WAY[key][0] if isinstance(on, bool) else ("" if isinstance(on, str) else [])
    get_train_args({key: off, "stage": "sft"})
    with pytest.raises(ConfigError, match=rf"^'{key}: .*' \(a LLaMA-Factory key\) is not supported: .*{reason}"):
        get_train_args({key: on})


@pytest.mark.parametrize(("method", "reason"), [
    ("gptq", "already quantized with it: give that checkpoint as model_name_or_path without quantization_bit"),
    ("awq", "already quantized"), ("eetq", "need a CUDA GPU and the eetq package"), ("quanto", "not offered"),
])
def test_llamafactorys_other_quantization_methods_say_why(method, reason):
    with pytest.raises(ConfigError, match=f"'quantization_method: {method}' \\(LLaMA-Factory's\\) is not supported: "
                                          f".*{reason}"):
        get_train_args({"quantization_bit": 8, "quantization_method": method})


def test_llamafactorys_spellings_of_gym_keys():
    args = get_train_args({"disable_gradient_checkpointing": True, "infer_backend": "huggingface"})
    assert args.training.gradient_checkpointing is False and args.model.infer_backend == "hf"
    assert get_train_args({"disable_gradient_checkpointing": "false"}).training.gradient_checkpointing is True
    with pytest.raises(ConfigError, match="'disable_gradient_checkpointing' and 'gradient_checkpointing' both set"):
        get_train_args({"disable_gradient_checkpointing": True, "gradient_checkpointing": True})


def test_llamafactorys_other_engines_say_what_gym_serves_through():
    with pytest.raises(ConfigError, match="'infer_backend: sglang' .* not supported: Gym serves through fast"):
        get_train_args({"infer_backend": "sglang"})


def test_upcast_layernorm_is_refused_under_pure_bf16():
    with pytest.raises(ConfigError, match="'upcast_layernorm' .* pure_bf16 runs without autocast"):
        get_train_args({"upcast_layernorm": True, "pure_bf16": True, "finetuning_type": "full"})


def test_model_revision_of_a_local_folder_is_refused(tiny_model_dir):
    """transformers ignores a revision for a local folder: the run loaded whatever the folder held."""
    with pytest.raises(ConfigError, match=r"'model_revision: v1.0' picks a branch, tag or commit of a hub model; .* is "
                                          r"a local folder, which has none"):
        get_train_args({"model_name_or_path": str(tiny_model_dir), "model_revision": "v1.0"})
    assert get_train_args({"model_name_or_path": str(tiny_model_dir), "model_revision": "main"}).model.model_revision
