"""BitDelta on hand-made fine-tunes of the tiny model: the properties the paper's construction promises,
what is stored and how, distillation, and the options' meanings."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from gym.core.errors import ConfigError
from gym.delta.apply import apply_delta
from gym.delta.format import load_delta
from gym.delta.tensor_quant import QuantMethod, signs
from gym.quantization import BitDeltaConfig, BitDeltaQuantizer

C = 2.0**-9  # exactly representable in float16, so the stored scale is exactly c


def _compress(models, tiny_model_dir, finetune, tmp_path, **options):
    config = BitDeltaConfig(**{"distill_steps": 0, **options})
    result = BitDeltaQuantizer(config).compress(models(tiny_model_dir), models(finetune))
    path = result.save(tmp_path / "delta.safetensors", overwrite=True)  # tests compress several times into one path
    return result, path


def _rebuild(models, tiny_model_dir, path):
    entries, header = load_delta(path)
    return apply_delta(models(tiny_model_dir), entries, header, path)


def test_sign_times_constant_is_reconstructed_exactly(make_finetune, models, tiny_model_dir, tmp_path):
    generator = torch.Generator().manual_seed(1)
    signs_of = {}

    def change(name, param):
        if param.ndim == 2 and ".layers." in name:
            s = torch.where(torch.rand(param.shape, generator=generator) < 0.5, -1.0, 1.0)
            signs_of[name] = s
            param.add_(C * s)

    finetune = make_finetune(change)
    result, path = _compress(models, tiny_model_dir, finetune, tmp_path)
    for name, s in signs_of.items():
        entry = result.entries[name]
        assert entry.method == QuantMethod.BINARY and entry.params["granularity"] == "tensor"
        assert entry.tensors["scale"].float().item() == C  # alpha = mean|delta| = c
        assert torch.equal(signs(entry), s)
    tuned, rebuilt = models(finetune), _rebuild(models, tiny_model_dir, path)
    for name, param in rebuilt.named_parameters():
        assert torch.allclose(param, dict(tuned.named_parameters())[name], rtol=0, atol=1e-7), name


def test_unchanged_tensors_are_omitted_and_changed_norms_are_dense_and_exact(make_finetune, models, tiny_model_dir,
                                                                             tmp_path):
    def change(name, param):
        if name == "model.layers.0.mlp.up_proj.weight":
            param.add_(torch.full_like(param, C))
        if name == "model.layers.1.input_layernorm.weight":
            param.mul_(1.0 + torch.linspace(-0.1, 0.1, param.numel()))

    finetune = make_finetune(change)
    result, path = _compress(models, tiny_model_dir, finetune, tmp_path)
    assert set(result.entries) == {"model.layers.0.mlp.up_proj.weight", "model.layers.1.input_layernorm.weight"}
    assert isinstance(result.entries["model.layers.1.input_layernorm.weight"], torch.Tensor)  # dense
    tuned = dict(models(finetune).named_parameters())
    rebuilt = dict(_rebuild(models, tiny_model_dir, path).named_parameters())
    assert torch.equal(rebuilt["model.layers.1.input_layernorm.weight"], tuned["model.layers.1.input_layernorm.weight"])
    assert torch.equal(rebuilt["model.layers.0.mlp.up_proj.weight"], tuned["model.layers.0.mlp.up_proj.weight"])


def test_signs_are_packed_eight_per_byte(gaussian_finetune, models, tiny_model_dir, tmp_path):
    result, path = _compress(models, tiny_model_dir, gaussian_finetune, tmp_path)
    for entry in result.entries.values():
        rows, cols = entry.shape
        assert entry.tensors["codes"].dtype == torch.uint8 and entry.tensors["codes"].numel() == rows * cols // 8
    payload = sum(e.numel() // 8 + 2 for e in (torch.empty(x.shape) for x in result.entries.values()))
    assert result.payload_bytes == payload  # n*m/8 bytes of signs + one float16 scale per matrix
    assert path.stat().st_size < payload + 64 * 1024  # the rest is the JSON header


def test_group_size_gives_one_scale_per_group(gaussian_finetune, models, tiny_model_dir, tmp_path):
    per_matrix, _ = _compress(models, tiny_model_dir, gaussian_finetune, tmp_path)
    grouped, _ = _compress(models, tiny_model_dir, gaussian_finetune, tmp_path, group_size=32)
    name = "model.layers.0.mlp.down_proj.weight"  # 64 x 128
    assert grouped.entries[name].tensors["scale"].numel() == 64 * 128 // 32
    errors = {r.name: r.relative_error for r in per_matrix.report}
    assert all(r.relative_error <= errors[r.name] + 1e-6 for r in grouped.report)


def test_changed_embedding_gets_one_scale_per_row(make_finetune, models, tiny_model_dir, tmp_path):
    generator = torch.Generator().manual_seed(2)

    def change(name, param):
        if name == "model.embed_tokens.weight":
            param.add_(torch.randn(param.shape, generator=generator) * 1e-3)

    finetune = make_finetune(change)
    result, _ = _compress(models, tiny_model_dir, finetune, tmp_path)
    (entry,) = result.entries.values()
    assert entry.method == QuantMethod.BINARY and entry.params["granularity"] == "channel"
    assert entry.tensors["scale"].numel() == entry.shape[0]
    dense, _ = _compress(models, tiny_model_dir, finetune, tmp_path, compress_embeddings=False)
    assert isinstance(dense.entries["model.embed_tokens.weight"], torch.Tensor)


def test_safety_threshold_keeps_heavy_tailed_matrices_at_int8(make_finetune, models, tiny_model_dir, tmp_path):
    generator = torch.Generator().manual_seed(3)

    def change(name, param):
        if name == "model.layers.0.self_attn.q_proj.weight":  # a few large changes: 1 bit fits badly
            sparse = torch.rand(param.shape, generator=generator) < 0.01
            param.add_(torch.where(sparse, 0.1, 1e-5))
        elif param.ndim == 2 and ".layers." in name:  # Gaussian: 1-bit error sqrt(1 - 2/pi) = 0.60
            param.add_(torch.randn(param.shape, generator=generator) * 1e-3)

    finetune = make_finetune(change)
    plain, _ = _compress(models, tiny_model_dir, finetune, tmp_path)
    safe, _ = _compress(models, tiny_model_dir, finetune, tmp_path, safety_threshold=0.7)
    errors = {r.name: r.relative_error for r in plain.report}
    assert errors["model.layers.0.self_attn.q_proj.weight"] > 0.7
    assert all(0.5 < e < 0.7 for n, e in errors.items() if "q_proj" not in n or "layers.0" not in n)
    methods = {n: e.method for n, e in safe.entries.items()}
    assert methods.pop("model.layers.0.self_attn.q_proj.weight") == QuantMethod.INT8
    assert set(methods.values()) == {QuantMethod.BINARY}


def test_distillation_trains_only_the_scales_and_lowers_the_logit_mse(make_finetune, models, tiny_model_dir,
                                                                      tmp_path, data_dir, tokenizer):
    generator = torch.Generator().manual_seed(5)

    def change(name, param):  # large enough for the logit gap to stand well above bf16 rounding
        if param.ndim == 2 and ".layers." in name:
            param.add_(torch.randn(param.shape, generator=generator) * 1e-2)

    gaussian_finetune = make_finetune(change)
    quantizer = BitDeltaQuantizer(BitDeltaConfig(distill_steps=30, distill_lr=1e-3, distill_seq_len=32,
                                                 distill_batch_size=2, calibration="tiny_alpaca",
                                                 calibration_dir=str(data_dir)))
    before = BitDeltaQuantizer(BitDeltaConfig(distill_steps=0)).compress(models(tiny_model_dir),
                                                                         models(gaussian_finetune))
    after = quantizer.compress(models(tiny_model_dir), models(gaussian_finetune), tokenizer=tokenizer, progress=False)
    distilled = after.header["distillation"]
    assert distilled["steps"] == 30 and distilled["mse_after"] < distilled["mse_before"]
    for name, entry in after.entries.items():
        assert torch.equal(entry.tensors["codes"], before.entries[name].tensors["codes"])  # signs frozen
    assert any(not torch.equal(e.tensors["scale"], before.entries[n].tensors["scale"])
               for n, e in after.entries.items())


def test_distillation_that_raises_the_mse_keeps_the_scales_it_started_from(make_finetune, models, tiny_model_dir,
                                                                           data_dir, tokenizer):
    # A step far too large overshoots: the scales it leaves would serve a variant farther from the fine-tune.
    generator = torch.Generator().manual_seed(5)
    finetune = make_finetune(lambda name, p: p.add_(torch.randn(p.shape, generator=generator) * 1e-2)
                             if p.ndim == 2 and ".layers." in name else None)
    start = BitDeltaQuantizer(BitDeltaConfig(distill_steps=0)).compress(models(tiny_model_dir), models(finetune))
    overshot = BitDeltaQuantizer(BitDeltaConfig(distill_steps=3, distill_lr=10.0, distill_seq_len=32,
                                                distill_batch_size=2, calibration="tiny_alpaca",
                                                calibration_dir=str(data_dir))
                                 ).compress(models(tiny_model_dir), models(finetune), tokenizer=tokenizer,
                                            progress=False)
    distilled = overshot.header["distillation"]
    assert distilled["kept_initial"] and distilled["mse_after"] == distilled["mse_before"]
    for name, entry in overshot.entries.items():
        assert torch.equal(entry.tensors["scale"], start.entries[name].tensors["scale"])


def test_lora_adapter_is_merged_before_the_delta_is_taken(tiny_model_dir, models, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                                LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.01)
    peft_model.save_pretrained(tmp_path / "adapter")
    result = BitDeltaQuantizer().compress(models(tiny_model_dir), models(tmp_path / "adapter"))
    assert {n.split(".")[-2] for n in result.entries} == {"q_proj", "v_proj"}
    assert len(result.entries) == 4  # two layers x two targets


def test_config_errors():
    with pytest.raises(ConfigError, match="BitDelta stores 1 bit per weight"):
        BitDeltaConfig(bits=2)
    assert BitDeltaConfig(distill_steps=10).calibration is None  # chosen when compression starts
    with pytest.raises(ConfigError, match="group_size"):
        BitDeltaConfig(group_size=0, distill_steps=0)
    assert BitDeltaConfig(enable_deltasoup=True, distill_steps=0).enable_deltasoup



@pytest.mark.parametrize("field, value, says", [
    ("distill_lr", 0.0, "> 0"), ("distill_lr", -1e-4, "> 0"), ("distill_lr", float("nan"), "> 0"),
    ("distill_steps", -1, "at least 0"), ("distill_steps", 2.5, "whole number"), ("distill_seq_len", 0, "at least 1"),
    ("distill_batch_size", 0, "at least 1"), ("group_size", 0, "at least 1"), ("safety_threshold", 0.0, "> 0"),
    ("compress_embeddings", "no", "True or False"), ("calibration_dir", None, "a path"),
    ("seed", 2**64, "2^64 - 1")])
def test_impossible_values_are_refused_naming_the_field_and_range(field, value, says):
    with pytest.raises(ConfigError, match=f"'{field}' must .*{re.escape(says)}"):
        BitDeltaConfig(**{field: value})


def test_legitimate_edge_values_are_kept():
    config = BitDeltaConfig(distill_steps=0, safety_threshold=1.5, group_size=1, seed=-1,
                            calibration=Path("rows.json"), calibration_dir=Path("data"))
    assert config.safety_threshold == 1.5 and config.seed == -1
    assert (config.calibration, config.calibration_dir) == ("rows.json", "data")  # JSON-able in the delta's header

def test_enable_deltasoup_is_recorded(gaussian_finetune, models, tiny_model_dir, tmp_path):
    _, path = _compress(models, tiny_model_dir, gaussian_finetune, tmp_path, enable_deltasoup=True)
    assert load_delta(path)[1]["deltasoup"] == {"eligible": True}
    _, path = _compress(models, tiny_model_dir, gaussian_finetune, tmp_path)
    assert load_delta(path)[1]["deltasoup"] == {"eligible": False}


def test_embedding_scales_are_distilled_only_when_asked(make_finetune, models, tiny_model_dir, data_dir, tokenizer):
    generator = torch.Generator().manual_seed(6)

    def change(name, param):
        if name == "model.embed_tokens.weight" or (param.ndim == 2 and ".layers." in name):
            param.add_(torch.randn(param.shape, generator=generator) * 1e-2)

    finetune = make_finetune(change)
    embedding = "model.embed_tokens.weight"
    start = BitDeltaQuantizer().compress(models(tiny_model_dir), models(finetune)).entries[embedding]

    def distilled(**options):
        config = BitDeltaConfig(distill_steps=5, distill_lr=1e-3, distill_seq_len=32, calibration="tiny_alpaca",
                                calibration_dir=str(data_dir), **options)
        return BitDeltaQuantizer(config).compress(models(tiny_model_dir), models(finetune), tokenizer=tokenizer,
                                                  progress=False).entries

    default = distilled()
    assert torch.equal(default[embedding].tensors["scale"], start.tensors["scale"])  # kept at mean|delta| per row
    assert not torch.equal(distilled(distill_embeddings=True)[embedding].tensors["scale"], start.tensors["scale"])
