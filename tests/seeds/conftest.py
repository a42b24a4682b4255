"""The seeds (the documents Gym was first described in) as users will copy them.

Each test reproduces one snippet or YAML block with our own code: the same calls and keys, a hub model id
swapped for the tiny local model, and run settings shrunk where a snippet would train for hours. Where a
snippet asks for something this machine cannot do (a CUDA kernel, the network), the test checks the clear
error, then runs the closest thing that works.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml


@pytest.fixture()
def write_yaml(tmp_path):
    """write_yaml(text, **replace) -> the path of a YAML file holding the seed's block, keys replaced."""

    def write(text: str, name: str = "config.yaml", **replace) -> Path:
        values = yaml.safe_load(text)
        values.update(replace)
        path = tmp_path / name
        path.write_text(yaml.safe_dump(values, sort_keys=False))
        return path

    return write


@pytest.fixture(autouse=True)
def own_gym_home(tmp_path, monkeypatch):
    """Soups and variants go under $GYM_HOME by default: a fresh one per test, sharing the real one's converted
    models and compiled kernels (linked, so nothing is converted or compiled again)."""
    from gym.core.home import gym_home
    from gym.models.loader import resolve_model_path

    resolve_model_path("smollm2-135m")
    real = gym_home()
    home = tmp_path / "gym-home"
    home.mkdir()
    for child in real.iterdir():
        if child.name not in ("soups", "variants"):
            (home / child.name).symlink_to(child)
    monkeypatch.setenv("GYM_HOME", str(home))
    return home


@pytest.fixture()
def lora_finetune(tiny_model_dir):
    """lora_finetune(seed, target) -> a PEFT model of the tiny base: one LoRA adapter every user shares (what the
    community learnt) plus the user's own change to its B matrices, seeded by `seed`. Honest fine-tunes of one
    task agree like this; adapters drawn independently are nearly orthogonal, and as a soup pays for agreement
    with the others (gym.soup.payouts) it would rightly pay them nothing."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    def make(seed: int, target: str = "q_proj"):
        torch.manual_seed(0)
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                               LoraConfig(r=2, target_modules=[target], init_lora_weights=False))
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.add_(torch.randn(param.shape, generator=generator) * 0.5 * param.std())
        return model

    return make


@pytest.fixture()
def lora_delta():
    """lora_delta(peft_model) -> {base parameter name: scaling * B @ A}: what the adapter adds to the base,
    computed from the LoRA matrices themselves (not by Gym), in float64."""

    def delta(model) -> dict:
        config = model.peft_config["default"]
        params = dict(model.named_parameters())
        out = {}
        for name, a in params.items():
            if ".lora_A.default." in name:
                b = params[name.replace(".lora_A.", ".lora_B.")]
                base_name = name.removeprefix("base_model.model.").replace(".lora_A.default", "")
                out[base_name] = (config.lora_alpha / config.r) * (b.double() @ a.double()).detach()
        return out

    return delta



@pytest.fixture()
def assert_serves_variant(tiny_model_dir):
    """assert_serves_variant(chat): the served ChatModel is the tiny base with a variant's delta in every linear
    layer of its blocks (what Gym's lora_target: all trains) and nowhere else, not the base itself."""
    import torch
    from safetensors.torch import load_file

    linear = [f"model.layers.{i}.{m}.weight" for i in range(2) for m in (
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
        "mlp.down_proj")]

    def check(chat) -> None:
        base = load_file(str(tiny_model_dir / "model.safetensors"))
        served = chat.model.state_dict()
        changed = sorted(k for k in base if not torch.equal(served[k].to(base[k].dtype), base[k]))
        assert changed == sorted(linear)

    return check
