from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests.gym_cli import gym_here

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


def test_a_missing_folder_under_a_local_one_is_not_called_a_hub_model(tmp_path, monkeypatch):
    """`out/nothere` has a hub id's shape; offline, with `out/` right here, it is the folder the user meant."""
    (tmp_path / "out").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError, match=r"^Model folder not found: out/nothere \(out has no nothere; nor is a hub"):
        resolve_model_path("out/nothere")
    with pytest.raises(ModelError, match=r"not in the local Hugging Face cache.*Did you mean 'smollm2-135m'\?$"):
        resolve_model_path("smollm2-13m")  # a bare name is never taken for a folder of the working directory


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


def test_a_gguf_is_parsed_once_per_conversion_and_converts_to_the_same_weights(tiny_model_dir, tmp_path, monkeypatch):
    """transformers reads a GGUF once for the tokenizer's config, once for the tokenizer, once for the model;
    each read of the embedded model's vocabulary took ~4 s. A conversion now parses the file once and builds the
    weight-name map once, and leaves gguf as it found it."""
    import gguf
    import torch
    from safetensors.torch import load_file
    from transformers import PreTrainedTokenizerFast

    from gym.models.loader import load_gguf_tokenizer

    monkeypatch.setenv("GYM_HOME", str(tmp_path / "home"))
    assert gym_here("export", "--model_name_or_path", tiny_model_dir, "--export_dir", tmp_path / "out",
                    "--format", "gguf", "--quantization", "f32").returncode == 0
    [gguf_path] = (tmp_path / "out").glob("*.gguf")

    parses: list[str] = []

    class CountingReader(gguf.GGUFReader):
        def __init__(self, path, mode="r"):
            parses.append(str(path))
            super().__init__(path, mode)

    maps: list[tuple[object, int]] = []
    build_map = gguf.get_tensor_name_map

    def counting_map(arch, n_blocks):
        maps.append((arch, n_blocks))
        return build_map(arch, n_blocks)

    monkeypatch.setattr(gguf, "GGUFReader", CountingReader)
    monkeypatch.setattr(gguf, "get_tensor_name_map", counting_map)
    converted = Path(resolve_model_path(str(gguf_path)))
    assert parses == [str(gguf_path)]
    assert len(maps) == 1
    assert gguf.GGUFReader is CountingReader and gguf.get_tensor_name_map is counting_map  # put back

    # The same weights as the model the GGUF was written from (float32 both ways: nothing rounds).
    original, loaded = load_file(tiny_model_dir / "model.safetensors"), load_file(converted / "model.safetensors")
    assert original.keys() == loaded.keys()
    for name, tensor in original.items():
        assert torch.equal(tensor, loaded[name]), name

    parses.clear()
    tokenizer = load_gguf_tokenizer(gguf_path)
    assert parses == [str(gguf_path)]
    text = "Gym parses a GGUF once."
    assert tokenizer.encode(text) == PreTrainedTokenizerFast.from_pretrained(tiny_model_dir).encode(text)
