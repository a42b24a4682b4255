"""Every kind of contribution becomes the same float32 delta; unreadable input raises, wrong input is rejected."""

from __future__ import annotations

import pytest
import torch

from gym.core.errors import ConfigError, ModelError
from gym.soup.contributions import Base, Rejected, l2_norm, to_delta

NAME = "model.layers.1.mlp.down_proj.weight"


@pytest.fixture()
def base(tiny_model_dir):
    return Base(str(tiny_model_dir))


def _bump(name, param):
    if name == NAME:
        param.add_(torch.linspace(-1e-2, 1e-2, param.numel()).reshape(param.shape))


def test_a_model_folder_and_a_model_object_give_the_same_delta_of_only_the_changed_parameters(base, make_finetune):
    from transformers import AutoModelForCausalLM

    folder = make_finetune(_bump)
    from_folder = to_delta(str(folder), base)
    from_object = to_delta(AutoModelForCausalLM.from_pretrained(folder), base)
    assert from_folder.source == "model_folder" and from_object.source == "model"
    assert list(from_folder.delta) == [NAME] and list(from_object.delta) == [NAME]
    expected = torch.linspace(-1e-2, 1e-2, from_folder.delta[NAME].numel()).reshape(from_folder.delta[NAME].shape)
    assert torch.allclose(from_folder.delta[NAME], expected, atol=1e-6)
    assert torch.equal(from_folder.delta[NAME], from_object.delta[NAME])
    assert from_folder.delta[NAME].dtype == torch.float32


def test_a_lora_adapter_is_merged_onto_the_base(base, tiny_model_dir, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                                LoraConfig(r=4, target_modules=["q_proj"], lora_alpha=8))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.fill_(0.05)
    peft_model.save_pretrained(tmp_path / "adapter")
    converted = to_delta(tmp_path / "adapter", base)
    assert converted.source == "lora_adapter"
    assert sorted(converted.delta) == [f"model.layers.{i}.self_attn.q_proj.weight" for i in (0, 1)]
    layer = peft_model.base_model.model.model.layers[0].self_attn.q_proj
    expected = (layer.lora_B["default"].weight @ layer.lora_A["default"].weight) * 2.0  # alpha / r
    assert torch.allclose(converted.delta["model.layers.0.self_attn.q_proj.weight"], expected, atol=1e-6)


def test_pickled_weights_are_never_loaded(base, tmp_path):
    model = tmp_path / "pickled-model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "pytorch_model.bin").write_bytes(b"not even a pickle")
    with pytest.raises(ModelError, match=r"\.bin"):
        to_delta(model, base)
    adapter = tmp_path / "pickled-adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    (adapter / "adapter_model.bin").write_bytes(b"x")
    with pytest.raises(ModelError, match="adapter_model.bin"):
        to_delta(adapter, base)
    (tmp_path / "weights.pt").write_bytes(b"x")
    with pytest.raises(ConfigError, match="never loaded"):
        to_delta(tmp_path / "weights.pt", base)


def test_unreadable_input_raises(base, tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        to_delta(tmp_path / "missing", base)
    with pytest.raises(ConfigError, match="neither"):
        to_delta(tmp_path, base)
    with pytest.raises(ConfigError, match="a list"):
        to_delta([1, 2], base)


def _delta_file(base_dir, finetuned_dir, out, eligible: bool):
    from gym.delta.weights import load_model
    from gym.quantization import BitDeltaConfig, BitDeltaQuantizer

    result = BitDeltaQuantizer(BitDeltaConfig(distill_steps=0, enable_deltasoup=eligible)).compress(
        load_model(str(base_dir)), load_model(str(finetuned_dir)), base_name="tiny")
    return result, result.save(out)


def test_a_bitdelta_file_is_decoded_when_its_owner_opted_in(base, tiny_model_dir, make_finetune, tmp_path):
    from gym.delta.compress import reconstruct

    result, path = _delta_file(tiny_model_dir, make_finetune(_bump), tmp_path / "d.safetensors", eligible=True)
    converted = to_delta(path, base)
    assert converted.source == "delta_file"
    assert converted.info == {"delta_method": "bitdelta", "deltasoup_eligible": True}
    assert torch.equal(converted.delta[NAME], reconstruct(result.entries[NAME]))
    assert converted.delta[NAME].unique().numel() == 2  # one bit: +alpha or -alpha


def test_a_delta_file_not_marked_for_deltasoup_or_from_another_base_is_rejected(base, tiny_model_dir,
                                                                                make_finetune, tmp_path):
    _, private = _delta_file(tiny_model_dir, make_finetune(_bump), tmp_path / "p.safetensors", eligible=False)
    with pytest.raises(Rejected, match="enable-deltasoup"):
        to_delta(private, base)
    other_base = make_finetune(lambda n, p: p.add_(0.5), "other-base")
    _, foreign = _delta_file(other_base, tiny_model_dir, tmp_path / "f.safetensors", eligible=True)
    with pytest.raises(Rejected, match="base fingerprint differs"):
        to_delta(foreign, base)


def test_a_dict_is_the_delta_itself_and_is_checked(base):
    shape = base.params[NAME].shape
    converted = to_delta({NAME: torch.ones(shape, dtype=torch.bfloat16), "model.norm.weight": torch.zeros(64)}, base)
    assert list(converted.delta) == [NAME] and converted.delta[NAME].dtype == torch.float32  # zero entries dropped
    assert l2_norm(converted.delta) == pytest.approx(shape.numel() ** 0.5)
    cases = [({"nope.weight": torch.ones(2)}, "does not have"),
             ({NAME: torch.ones(3, 3)}, "shape differs"),
             ({NAME: torch.ones(shape, dtype=torch.int64)}, "dtype differs"),
             ({NAME: torch.full(shape, float("inf"))}, "non-finite"),
             ({NAME: [1.0]}, "not a tensor")]
    for delta, reason in cases:
        with pytest.raises(Rejected, match=reason):
            to_delta(delta, base)


def test_a_model_of_another_architecture_is_rejected(base, tmp_path, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    other = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         tie_word_embeddings=True))
    other.save_pretrained(tmp_path / "other")
    with pytest.raises(Rejected, match="shape differs"):
        to_delta(tmp_path / "other", base)
