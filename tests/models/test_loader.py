from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gym.core.errors import ModelError
from gym.models.loader import resolve_model_path


def test_embedded_default_is_a_converted_folder(embedded_dir):
    assert resolve_model_path(None) == str(embedded_dir)
    manifest = json.loads((embedded_dir / "gym_manifest.json").read_text())
    assert manifest["hub_id"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    config = json.loads((embedded_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["num_hidden_layers"] == 30


def test_offline_hub_model_not_cached_says_how_to_get_it():
    with pytest.raises(ModelError, match=r"HF_HUB_OFFLINE=1.*hf download Qwen/Qwen3-0.6B"):
        resolve_model_path("zen-nano")


def test_missing_local_paths_are_clear():
    with pytest.raises(ModelError, match="GGUF file not found"):
        resolve_model_path("./nowhere/model.gguf")
    with pytest.raises(ModelError, match="Model folder not found"):
        resolve_model_path("./nowhere/model")


def test_local_folder_is_used_as_is(tiny_model_dir):
    assert resolve_model_path(str(tiny_model_dir)) == str(tiny_model_dir)


@pytest.mark.slow
def test_two_processes_converting_at_once_produce_one_good_folder(tmp_path):
    """The first run of every machine converts the GGUF; two commands started together must not
    corrupt the cache. Both processes convert into a fresh GYM_HOME at the same time."""
    code = ("import sys; from gym.models.loader import resolve_model_path; "
            "from transformers import AutoModelForCausalLM; p = resolve_model_path(None); "
            "AutoModelForCausalLM.from_pretrained(p); print(p)")
    env = {"GYM_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    folder = Path(outs[0][0].strip().splitlines()[-1])
    assert folder == tmp_path / "models" / "smollm2-135m"
    leftovers = [p.name for p in folder.parent.iterdir() if ".tmp-" in p.name]
    assert not leftovers
