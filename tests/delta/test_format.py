"""The delta file against hostile input: wrong base, shape mismatch, NaN/Inf, truncation, unknown versions,
foreign files. Each is a clear error and nothing is written."""

from __future__ import annotations

import json

import pytest
import torch

from gym.core.errors import ConfigError, OutputError
from gym.delta.apply import apply_delta, write_applied
from gym.delta.format import HEADER_KEY, fingerprint, load_delta, read_header
from gym.delta.weights import parameters
from gym.quantization import BitDeltaQuantizer


@pytest.fixture()
def delta_file(gaussian_finetune, models, tiny_model_dir, tmp_path):
    result = BitDeltaQuantizer().compress(models(tiny_model_dir), models(gaussian_finetune), base_name="tiny")
    return result.save(tmp_path / "delta.safetensors")


def test_header_describes_the_delta(delta_file, models, tiny_model_dir):
    header = read_header(delta_file)
    assert header["format"] == "gym-delta" and header["version"] == 1 and header["method"] == "bitdelta"
    assert header["base"]["fingerprint"] == fingerprint(parameters(models(tiny_model_dir)))
    assert header["options"]["distill_steps"] == 0
    entry = header["entries"]["model.layers.0.mlp.up_proj.weight"]
    assert entry["encoding"] == "binary" and entry["shape"] == [128, 64]
    stats = header["stats"]["entries"]["model.layers.0.mlp.up_proj.weight"]
    assert stats["bytes"] == 128 * 64 // 8 + 2 and 0.5 < stats["relative_error"] < 0.7


def test_wrong_base_is_refused_and_nothing_is_written(delta_file, make_finetune, tmp_path):
    other = make_finetune(lambda name, p: p.mul_(1.01), "other-base")
    out = tmp_path / "applied"
    with pytest.raises(ConfigError, match="made from a different base model \\(tiny\\)"):
        write_applied(str(other), delta_file, out)
    assert not out.exists()


def test_shape_mismatch_is_refused(delta_file, models, tiny_model_dir):
    entries, header = load_delta(delta_file)
    base = models(tiny_model_dir)
    name = "model.layers.0.mlp.up_proj.weight"
    entries[name] = torch.zeros(3, 3)
    with pytest.raises(ConfigError, match=f"{name} is 3x3 in the delta and 128x64 in this base"):
        apply_delta(base, entries, header, delta_file)


def test_a_base_of_another_size_is_refused_naming_both_shapes(delta_file, tmp_path, tokenizer):
    # The fingerprint alone refused it as "a different base model": true, but not what is wrong (the sizes).
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "narrow")
    tokenizer.save_pretrained(tmp_path / "narrow")
    with pytest.raises(ConfigError, match=r"does not fit this base: model\.layers\.0\.\S+ is \d+x64 in the delta and "
                                          r"\d+x32 in this base\. It was made from tiny: apply it to that base\."):
        write_applied(str(tmp_path / "narrow"), delta_file, tmp_path / "applied")
    assert not (tmp_path / "applied").exists()


def test_nan_in_the_finetune_is_refused(make_finetune, models, tiny_model_dir):
    broken = make_finetune(lambda name, p: p.fill_(float("nan")) if "layers.1.mlp.up_proj" in name else None, "nan")
    with pytest.raises(ConfigError, match="contains NaN or Inf"):
        BitDeltaQuantizer().compress(models(tiny_model_dir), models(broken))


def test_different_architecture_is_refused(tmp_path, models, tiny_model_dir, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "narrow")
    with pytest.raises(ConfigError, match="Shape mismatch for"):
        BitDeltaQuantizer().compress(models(tiny_model_dir), models(tmp_path / "narrow"))


def test_truncated_file_is_refused(delta_file, tmp_path):
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(delta_file.read_bytes()[: delta_file.stat().st_size // 2])
    with pytest.raises(ConfigError, match="not a readable delta file"):
        load_delta(cut)


def _rewrite_header(path, target, **changes):
    from safetensors.torch import load_file, save_file

    header = json.loads(__import__("safetensors").safe_open(str(path), "pt").metadata()[HEADER_KEY])
    header.update(changes)
    save_file(load_file(str(path)), str(target), metadata={HEADER_KEY: json.dumps(header)})
    return target


def test_unknown_version_and_foreign_files_are_refused(delta_file, tmp_path):
    from safetensors.torch import save_file

    with pytest.raises(ConfigError, match="version 99 is not supported"):
        load_delta(_rewrite_header(delta_file, tmp_path / "future.safetensors", version=99))
    with pytest.raises(ConfigError, match="unknown delta format"):
        load_delta(_rewrite_header(delta_file, tmp_path / "other.safetensors", format="something-else"))
    save_file({"w": torch.zeros(2)}, str(tmp_path / "plain.safetensors"))
    with pytest.raises(ConfigError, match="not a Gym delta"):
        load_delta(tmp_path / "plain.safetensors")
    with pytest.raises(ConfigError, match="not found"):
        load_delta(tmp_path / "missing.safetensors")


def test_inf_in_a_stored_scale_is_refused(delta_file, tmp_path):
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(delta_file))
    key = next(k for k in tensors if k.endswith("::scale"))
    tensors[key] = torch.full_like(tensors[key], float("inf"))
    metadata = __import__("safetensors").safe_open(str(delta_file), "pt").metadata()
    save_file(tensors, str(tmp_path / "inf.safetensors"), metadata=metadata)
    with pytest.raises(ConfigError, match="contains NaN or Inf"):
        load_delta(tmp_path / "inf.safetensors")


def test_applied_folder_loads_with_transformers(delta_file, tiny_model_dir, tmp_path, models):
    from transformers import AutoModelForCausalLM

    out = write_applied(str(tiny_model_dir), delta_file, tmp_path / "applied")
    loaded = AutoModelForCausalLM.from_pretrained(out)
    entries, header = load_delta(delta_file)
    expected = apply_delta(models(tiny_model_dir), entries, header)
    assert all(torch.equal(p, dict(expected.named_parameters())[n]) for n, p in loaded.named_parameters())
    assert (out / "tokenizer.json").is_file() or (out / "tokenizer_config.json").is_file()
    with pytest.raises(OutputError, match="already exists .*pass --overwrite"):
        write_applied(str(tiny_model_dir), delta_file, out)
    write_applied(str(tiny_model_dir), delta_file, out, overwrite=True)
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
