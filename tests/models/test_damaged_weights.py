"""A LoRA adapter with NaN or inf in it, or a weights file cut short, is one line naming the file (and the tensor)
from every door that loads one, exit 2: chat, the API server, infer, export (merged and gguf-lora) and merge. Before,
a NaN adapter was served and exported as garbage, and a truncated file was safetensors' "Error while deserializing
header" naming no file."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from tests.conftest import free_port
from tests.gym_cli import assert_one_line_error, gym_here

NAN_TENSOR = "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"


@pytest.fixture(scope="module")
def adapter(tmp_path_factory, tiny_model_dir) -> Path:
    """A LoRA adapter that fits the tiny base, with random (non-zero) A and B."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("adapters") / "good"
    get_peft_model(LlamaForCausalLM.from_pretrained(tiny_model_dir),
                   LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
                   ).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def nan_adapter(adapter) -> Path:
    """The adapter with one value of one tensor NaN, as a diverged run saves it."""
    from safetensors.torch import load_file, save_file

    folder = adapter.with_name("nan")
    shutil.copytree(adapter, folder)
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    tensors[NAN_TENSOR][0, 0] = float("nan")
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def cut_adapter(adapter) -> Path:
    """The adapter with its weights file cut after 1000 bytes, as an interrupted copy leaves it."""
    folder = adapter.with_name("cut")
    shutil.copytree(adapter, folder)
    weights = folder / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    return folder


DOORS = {
    "chat": ["chat", "--prompt", "Hi"],
    "infer": ["infer", "--dataset", "tiny_alpaca", "-o", "{tmp}/out.jsonl"],
    "export": ["export", "--export_dir", "{tmp}/out"],
    "export gguf-lora": ["export", "--format", "gguf-lora", "--export_dir", "{tmp}/out.gguf"],
    "api": ["api", "--port", "{port}"],
}


def _door(name: str, model: Path, folder: Path, data_dir: Path, tmp_path: Path,
          monkeypatch: pytest.MonkeyPatch) -> list[str]:
    verb, *rest = DOORS[name]
    if verb == "api":  # a server that loaded the adapter would serve until stopped: fail instead
        import gym.serve.server

        def served(*args: object, **kwargs: object) -> None:
            raise AssertionError("gym api loaded the adapter and went on to serve it")

        monkeypatch.setattr(gym.serve.server, "create_app", served)
    args = [verb, "--model_name_or_path", str(model), "--adapter_name_or_path", str(folder)]
    if verb == "infer":
        args += ["--dataset_dir", str(data_dir)]
    return args + [a.format(tmp=tmp_path, port=free_port()) for a in rest]


@pytest.mark.parametrize("door", list(DOORS))
def test_an_adapter_with_nan_is_refused_naming_file_and_tensor(door, nan_adapter, tiny_model_dir, data_dir, tmp_path,
                                                               monkeypatch):
    done = gym_here(*_door(door, tiny_model_dir, nan_adapter, data_dir, tmp_path, monkeypatch))
    assert_one_line_error(done, f"{nan_adapter / 'adapter_model.safetensors'}: the tensor {NAN_TENSOR} holds NaN or "
                          "inf values")
    assert not list(tmp_path.glob("out*"))


@pytest.mark.parametrize("door", list(DOORS))
def test_a_truncated_adapter_is_refused_naming_the_file(door, cut_adapter, tiny_model_dir, data_dir, tmp_path,
                                                        monkeypatch):
    done = gym_here(*_door(door, tiny_model_dir, cut_adapter, data_dir, tmp_path, monkeypatch))
    assert_one_line_error(done, f"{cut_adapter / 'adapter_model.safetensors'} is damaged or incomplete",
                          "Re-download or re-export it")
    assert not list(tmp_path.glob("out*"))


def test_the_good_adapter_still_loads(adapter, tiny_model_dir):
    # What the two tests above refuse is the damage, not the adapter: the same adapter whole is served.
    done = gym_here("chat", "--model_name_or_path", tiny_model_dir, "--adapter_name_or_path", adapter, "--prompt",
                    "Hi", "--max_new_tokens", "2")
    assert done.returncode == 0, done.stderr[-2000:]


def test_merge_names_the_adapter_tensor_not_the_merge(nan_adapter, adapter, tiny_model_dir, tmp_path):
    # Before, the NaN surfaced as "The linear merge gives inf or NaN ...: lower lambda or the weights".
    import yaml

    config = tmp_path / "merge.yaml"
    config.write_text(yaml.safe_dump({
        "merge_method": "linear", "base_model": str(tiny_model_dir), "output_dir": str(tmp_path / "out"),
        "models": [{"model": str(adapter), "parameters": {"weight": 0.5}},
                   {"model": str(nan_adapter), "parameters": {"weight": 0.5}}]}))
    assert_one_line_error(gym_here("merge", config), f"the tensor {NAN_TENSOR} holds NaN or inf values")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("verb", [["chat", "--prompt", "Hi"], ["export", "--export_dir", "{tmp}/out"]])
def test_a_truncated_model_file_is_named(verb, tiny_model_dir, tmp_path):
    # transformers' from_pretrained says only "Error while deserializing header: invalid header length"; the loader
    # names the file (of a sharded model, which one).
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "model.safetensors").write_bytes((tiny_model_dir / "model.safetensors").read_bytes()[:1000])
    done = gym_here(verb[0], "--model_name_or_path", model, *(a.format(tmp=tmp_path) for a in verb[1:]))
    assert_one_line_error(done, f"{model / 'model.safetensors'} is damaged or incomplete")
    assert not (tmp_path / "out").exists()


def test_a_reward_model_or_dpo_reference_adapter_with_nan_is_refused(nan_adapter, tiny_model_dir, tmp_path):
    # Both loaded their adapters with peft directly: a NaN reward adapter scored every answer NaN, and a NaN
    # reference made DPO's loss NaN from the first step.
    import json

    import torch
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForSequenceClassification

    from gym.core.errors import ModelError
    from gym.rewards.reward_model import load_reward_model

    base = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1, dtype=torch.float32)
    folder = tmp_path / "rm-lora"
    get_peft_model(base, LoraConfig(task_type="SEQ_CLS", r=4, target_modules=["q_proj", "v_proj"],
                                    init_lora_weights=False)).save_pretrained(folder)
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    broken = sorted(name for name in tensors if "lora_B" in name)[0]
    tensors[broken][0, 0] = float("nan")
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = folder / "adapter_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "base_model_name_or_path": str(tiny_model_dir)}))
    with pytest.raises(ModelError, match=f"the tensor {broken} holds NaN or inf"):
        load_reward_model(str(folder))

    from gym.config.parser import get_train_args
    from gym.train.methods.dpo import _reference_model

    args = get_train_args({"model_name_or_path": str(tiny_model_dir), "stage": "dpo", "dataset": "x",
                           "output_dir": str(tmp_path / "out"), "ref_model": str(tiny_model_dir),
                           "ref_model_adapters": str(nan_adapter)}, complete=False)

    class NoMedia:
        media = None

    with pytest.raises(ModelError, match=f"the tensor {NAN_TENSOR} holds NaN or inf"):
        _reference_model(args, args.options, NoMedia())  # type: ignore[arg-type]
