"""Quantized bases (quantization_bit): really quantized in memory, adapters train on them, LoftQ and PiSSA start
closer to the original model than plain rounding, and every combination that cannot run here is a config error."""

from __future__ import annotations

import importlib.util
import logging
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gym.config.parser import get_train_args
from gym.core.errors import ConfigError
from gym.models.base_quantization import is_quantized
from gym.models.loader import load_causal_lm

pytestmark = pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None,
                                reason="bitsandbytes is part of the dev install (make setup)")

PROMPT = [[1, 504, 3458, 314, 253, 1343, 282, 3051, 30, 21, 1034, 216, 33, 351]]


def _model_args(tiny_model_dir: Path, **keys):
    return get_train_args({"model_name_or_path": str(tiny_model_dir), **keys}).model


def _linear_weights(model) -> dict[str, torch.Tensor]:
    return {n: p for n, p in model.named_parameters() if "layers." in n and n.endswith("proj.weight")}


def test_4bit_base_holds_half_a_byte_per_weight(tiny_model_dir):
    plain = load_causal_lm(str(tiny_model_dir))
    quantized = load_causal_lm(str(tiny_model_dir), _model_args(tiny_model_dir, quantization_bit=4))
    assert is_quantized(quantized) and not is_quantized(plain)
    q_proj = quantized.model.layers[0].self_attn.q_proj
    assert type(q_proj).__name__ == "Linear4bit" and q_proj.weight.quant_state.quant_type == "nf4"
    plain_bytes = sum(p.numel() * p.element_size() for p in _linear_weights(plain).values())
    packed_bytes = sum(p.numel() * p.element_size() for p in _linear_weights(quantized).values())
    assert all(p.dtype == torch.uint8 for p in _linear_weights(quantized).values())
    assert packed_bytes * 8 == plain_bytes  # float32 (4 bytes) -> 4 bits, scales kept apart in quant_state
    # The rounding is real but small: NF4 keeps each weight within its block's scale.
    weight = plain.model.layers[0].self_attn.q_proj.weight
    import bitsandbytes as bnb

    rounded = bnb.functional.dequantize_4bit(q_proj.weight.data, q_proj.weight.quant_state)
    error = (rounded - weight).norm() / weight.norm()
    assert 0.01 < error < 0.2


def test_the_log_says_the_base_is_4bit_and_what_that_saved(tiny_model_dir, caplog):
    """One line: the format, the bytes its weights take (codes and scales) and what they take in float32."""
    with caplog.at_level(logging.INFO, logger="gym.models.loader"):
        plain = load_causal_lm(str(tiny_model_dir))
        assert not [r for r in caplog.records if r.getMessage().startswith("Base model")]
        load_causal_lm(str(tiny_model_dir), _model_args(tiny_model_dir, quantization_bit=4))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Base model")]
    assert len(lines) == 1
    found = re.fullmatch(r"Base model: 4-bit NF4 \(bitsandbytes, double quantization\), ([\d.]+) MB of weights "
                         r"instead of ([\d.]+) MB in float32", lines[0])
    assert found, lines[0]
    quantized, full = float(found[1]), float(found[2])
    assert full == round(sum(p.numel() for p in plain.parameters()) * 4 / 1e6, 1)
    # The linear weights go from 4 bytes to half a byte and a little for the scales; the rest stays float32.
    linear = sum(p.numel() for p in _linear_weights(plain).values()) * 4 / 1e6
    assert full - linear * 0.875 - 0.1 <= quantized <= full - linear * 0.8 + 0.1


def test_8bit_and_fp4_variants(tiny_model_dir):
    int8 = load_causal_lm(str(tiny_model_dir), _model_args(tiny_model_dir, quantization_bit=8))
    assert int8.model.layers[0].mlp.up_proj.weight.dtype == torch.int8
    fp4 = load_causal_lm(str(tiny_model_dir), _model_args(tiny_model_dir, quantization_bit=4, quantization_type="fp4",
                                                          double_quantization=False))
    state = fp4.model.layers[0].mlp.up_proj.weight.quant_state
    assert state.quant_type == "fp4" and not state.nested


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao is part of the dev install")
def test_torchao_int8_weights(tiny_model_dir):
    model = load_causal_lm(str(tiny_model_dir), _model_args(tiny_model_dir, quantization_bit=8,
                                                            quantization_method="torchao"))
    assert is_quantized(model)
    assert type(model.model.layers[0].self_attn.q_proj.weight).__name__ == "Int8Tensor"


@pytest.mark.parametrize(("keys", "message"), [
    ({"quantization_bit": 3}, "not a width quantization_method: bnb offers; use one of 4, 8"),
    ({"quantization_bit": 4, "finetuning_type": "full"}, "finetuning_type: full would update the quantized"),
    ({"quantization_bit": 4, "infer_dtype": "int8"}, "Set one"),
    ({"quantization_bit": 4, "quantization_method": "hqq"}, "hqq cannot quantize on load with the installed"),
    ({"loftq_init": True}, "needs quantization_bit: 4 with quantization_method: bnb"),
    ({"loftq_init": True, "quantization_bit": 4, "pissa_init": True}, "cannot be combined"),
    ({"quantization_bit": 4, "adapter_name_or_path": "a,b"}, "several adapters"),
    # Options the quantizer does not read: the base loaded otherwise than the config said.
    ({"quantization_type": "fp4"}, "'quantization_type: fp4' applies to quantization_bit: 4 with quantization_method: "
                                   "bnb; this config has no quantization_bit"),
    ({"quantization_bit": 8, "quantization_type": "fp4"}, "this config has quantization_bit: 8 with bnb"),
    ({"double_quantization": False}, "'double_quantization: False' applies to quantization_bit: 4"),
    ({"quantization_bit": 4, "quantization_group_size": 128}, "'quantization_group_size: 128' applies to "
                                                              "quantization_method: hqq or torchao"),
])
def test_what_cannot_run_is_a_config_error(tiny_model_dir, keys, message):
    with pytest.raises(ConfigError, match=message):
        get_train_args({"model_name_or_path": str(tiny_model_dir), **keys})


def _hide_package(monkeypatch, package: str) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == package else real(name, *a))


def test_torchao_4bit_without_its_cuda_kernels_is_a_config_error(tiny_model_dir, monkeypatch):
    _hide_package(monkeypatch, "mslk")
    with pytest.raises(ConfigError, match="needs torchao's CUDA int4 kernels"):
        get_train_args({"model_name_or_path": str(tiny_model_dir), "quantization_bit": 4,
                        "quantization_method": "torchao"})


def test_missing_package_is_named(tiny_model_dir, monkeypatch):
    _hide_package(monkeypatch, "bitsandbytes")
    with pytest.raises(ConfigError, match=r"needs the bitsandbytes package.*pip install bitsandbytes"):
        get_train_args({"model_name_or_path": str(tiny_model_dir), "quantization_bit": 4})


def test_qlora_trains_the_adapter_and_serves_like_its_merge(train_config, tiny_model_dir):
    """train on the 4-bit base -> the adapter moved; the 4-bit base + adapter (how chat serves QLoRA) and the
    adapter merged onto the unquantized base agree up to the base's rounding."""
    from peft import PeftModel

    from gym.workflows.training import run_exp

    result = run_exp(train_config(quantization_bit=4, max_steps=4))
    adapter = load_file(str(Path(result.output_dir) / "adapter_model.safetensors"))
    assert any("lora_B" in k and v.abs().max() > 0 for k, v in adapter.items())  # B starts at zero

    quantized = load_causal_lm(str(tiny_model_dir), _model_args(tiny_model_dir, quantization_bit=4))
    served = PeftModel.from_pretrained(quantized, result.output_dir).eval()
    merged = PeftModel.from_pretrained(load_causal_lm(str(tiny_model_dir)), result.output_dir).merge_and_unload()
    plain = load_causal_lm(str(tiny_model_dir))
    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        served_logits, merged_logits, base_logits = (m(ids).logits[0] for m in (served, merged.eval(), plain.eval()))
    # The adapter changed the model far more than 4-bit rounding separates the two ways of running it.
    assert (served_logits - merged_logits).norm() < 0.5 * (merged_logits - base_logits).norm()
    assert (served_logits.argmax(-1) == merged_logits.argmax(-1)).float().mean() >= 0.8


@pytest.mark.parametrize("keys", [{"quantization_bit": 8}, {"quantization_bit": 8, "quantization_method": "torchao"},
                                  {"quantization_bit": 4, "quantization_type": "fp4", "finetuning_type": "oft",
                                   "oft_block_size": 16}])
def test_adapters_train_on_every_quantized_base_this_cpu_runs(train_config, keys):
    if keys.get("quantization_method") == "torchao":
        pytest.importorskip("torchao")
    from gym.workflows.training import run_exp

    result = run_exp(train_config(**keys))
    saved = load_file(str(Path(result.output_dir) / "adapter_model.safetensors"))
    assert saved and result.global_step == 3 and result.final_loss is not None


def test_chat_serves_qlora_on_the_quantized_base(train_config, tiny_model_dir):
    from gym.infer.chat import ChatModel
    from gym.workflows.training import run_exp

    out = run_exp(train_config(quantization_bit=4)).output_dir
    chat = ChatModel({"model_name_or_path": str(tiny_model_dir), "adapter_name_or_path": out,
                      "quantization_bit": 4, "max_new_tokens": 4, "do_sample": False})
    assert is_quantized(chat.model) and type(chat.model).__name__ == "PeftModelForCausalLM"
    assert type(chat.engine).__name__ == "HFEngine"  # the fast engine takes float weights
    assert isinstance(chat.chat([{"role": "user", "content": "Add 1 and 2."}]), str)
    chat.close()


@torch.no_grad()
def _rounding_error(model, original) -> float:
    """||W - (rounded base + scaling B A)|| summed over the LoRA layers, against the unquantized weights."""
    import bitsandbytes as bnb

    total = 0.0
    for name, module in model.named_modules():
        if type(module).__name__ != "Linear4bit" or not hasattr(module, "lora_A"):
            continue
        weight = module.get_base_layer().weight
        effective = bnb.functional.dequantize_4bit(weight.data, weight.quant_state).float()
        effective = effective + module.get_delta_weight("default")
        total += float((original[name.removeprefix("base_model.model.") + ".weight"] - effective).norm())
    return total


def test_loftq_starts_nearer_the_original_weights(tiny_model_dir):
    from gym.models.adapters import setup_finetuning

    original = load_file(str(tiny_model_dir / "model.safetensors"))
    errors = {}
    for loftq in (False, True):
        args = get_train_args({"model_name_or_path": str(tiny_model_dir), "quantization_bit": 4, "lora_rank": 8,
                               "loftq_init": loftq})
        model = setup_finetuning(load_causal_lm(str(tiny_model_dir), args.model), args.finetuning)
        errors[loftq] = _rounding_error(model, original)
    assert errors[True] < 0.9 * errors[False]  # rank 8 of 64 removes a good share of the rounding error


def test_pissa_quantizes_the_residual(train_config, tmp_path, tiny_model_dir):
    """PiSSA under quantization_bit: the residual base is what gets rounded; residual + adapter starts nearer the
    original than the rounded original does, and the saved adapter applies to the original base."""
    from peft import PeftModel

    from gym.workflows.training import run_exp

    result = run_exp(train_config(quantization_bit=4, pissa_init=True, pissa_iter=-1, lora_rank=8, max_steps=1))
    out = Path(result.output_dir)
    assert (out / "pissa_residual" / "config.json").is_file()
    original = load_file(str(tiny_model_dir / "model.safetensors"))
    residual_args = _model_args(tiny_model_dir, quantization_bit=4)
    start = PeftModel.from_pretrained(load_causal_lm(str(out / "pissa_residual"), residual_args), out / "pissa_init")
    plain = get_train_args({"model_name_or_path": str(tiny_model_dir), "quantization_bit": 4})
    from gym.models.adapters import setup_finetuning

    rounded = setup_finetuning(load_causal_lm(str(tiny_model_dir), plain.model), plain.finetuning)
    assert _rounding_error(start, original) < 0.9 * _rounding_error(rounded, original)
    # The saved adapter was converted to plain LoRA of twice the rank, for the original (unquantized) base.
    import json

    assert json.loads((out / "adapter_config.json").read_text())["r"] == 16
