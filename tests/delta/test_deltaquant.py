"""DeltaQuant on the tiny model: every method end to end, its options, and mixed precision."""

from __future__ import annotations

import re

import pytest
import torch

from gym.core.errors import ConfigError
from gym.delta.apply import apply_delta
from gym.delta.deltaquant import BUDGET_LADDER
from gym.delta.distill import calibration_batches
from gym.delta.format import load_delta
from gym.delta.sensitivity import input_grams, weighted_error
from gym.delta.tensor_quant import BITS, QuantMethod, dequantize
from gym.delta.weights import Delta
from gym.quantization import DeltaQuantConfig, DeltaQuantizer


@pytest.mark.parametrize("method", [m.value for m in QuantMethod])
def test_every_method_round_trips_through_the_file(method, gaussian_finetune, models, tiny_model_dir, tmp_path):
    result = DeltaQuantizer(DeltaQuantConfig(method=method)).compress(models(tiny_model_dir), models(gaussian_finetune))
    path = result.save(tmp_path / f"{method}.safetensors")
    entries, header = load_delta(path)
    assert header["method"] == method and {e.method for e in entries.values()} == {QuantMethod(method)}
    rebuilt = dict(apply_delta(models(tiny_model_dir), entries, header).named_parameters())
    base, tuned = dict(models(tiny_model_dir).named_parameters()), dict(models(gaussian_finetune).named_parameters())
    for r in result.report:
        achieved = ((rebuilt[r.name] - base[r.name]) - (tuned[r.name] - base[r.name])).norm() / (
            tuned[r.name] - base[r.name]).norm()
        assert achieved.item() == pytest.approx(r.relative_error, rel=1e-3, abs=1e-4)
        assert r.bytes >= r.numel * BITS[QuantMethod(method)] // 8


def test_more_bits_less_error(gaussian_finetune, models, tiny_model_dir):
    def mean_error(method):
        result = DeltaQuantizer(DeltaQuantConfig(method=method)).compress(models(tiny_model_dir),
                                                                          models(gaussian_finetune))
        return sum(r.relative_error for r in result.report) / len(result.report)

    errors = [mean_error(m) for m in ("int8", "int4", "int2")]
    assert errors[0] < 0.01 < errors[1] < errors[2]


def test_granularity_options_reach_the_encodings(gaussian_finetune, models, tiny_model_dir):
    base, tuned = models(tiny_model_dir), models(gaussian_finetune)
    name = "model.layers.0.mlp.down_proj.weight"  # 64 x 128
    for config, scales in [(DeltaQuantConfig(method="int4"), 64),
                           (DeltaQuantConfig(method="int4", per_channel=False), 1),
                           (DeltaQuantConfig(method="int4", group_size=32), 64 * 4)]:
        entry = DeltaQuantizer(config).compress(base, tuned).entries[name]
        assert entry.tensors["scale"].numel() == scales
    asymmetric = DeltaQuantizer(DeltaQuantConfig(method="int4", symmetric=False)).compress(base, tuned).entries[name]
    assert "zero" in asymmetric.tensors and asymmetric.params["symmetric"] is False


def test_layer_bits_sets_the_method_per_layer(gaussian_finetune, models, tiny_model_dir):
    config = DeltaQuantConfig(method="int4", layer_bits={"*.mlp.down_proj.*": "int8", "self_attn.q_proj": 2})
    result = DeltaQuantizer(config).compress(models(tiny_model_dir), models(gaussian_finetune))
    for name, entry in result.entries.items():
        expected = "int8" if "down_proj" in name else "int2" if "q_proj" in name else "int4"
        assert entry.method.value == expected, name
    assert result.header["method"] == "mixed"


def test_bit_budget_gives_bits_where_they_remove_most_error():
    generator = torch.Generator().manual_seed(0)
    deltas = [Delta("a", "linear", torch.randn(64, 64, generator=generator)),
              Delta("b", "linear", torch.randn(64, 64, generator=generator))]
    # Layer a's inputs are 100x larger than b's: the same weight error moves a's outputs 100x more.
    grams = {"a": torch.eye(64, dtype=torch.float64) * 100, "b": torch.eye(64, dtype=torch.float64)}
    chosen = DeltaQuantizer(DeltaQuantConfig(bit_budget=3))._allocate(deltas, grams)
    assert BITS[chosen["a"]] > BITS[chosen["b"]]
    assert (BITS[chosen["a"]] + BITS[chosen["b"]]) / 2 <= 3
    assert set(chosen.values()) <= set(BUDGET_LADDER)


def test_bit_budget_with_calibration_stays_within_budget(gaussian_finetune, models, tiny_model_dir, data_dir,
                                                         tokenizer):
    config = DeltaQuantConfig(bit_budget=4, calibration_samples=4, calibration="tiny_alpaca",
                              calibration_dir=str(data_dir), seq_len=32)
    result = DeltaQuantizer(config).compress(models(tiny_model_dir), models(gaussian_finetune), tokenizer=tokenizer)
    weights = sum(r.numel for r in result.report)
    bits = sum(r.numel * BITS[QuantMethod(r.encoding)] for r in result.report)
    assert bits / weights <= 4 and len({r.encoding for r in result.report}) > 1


def test_calibrated_clipping_never_does_worse_than_none_on_the_calibration_weighting(make_finetune, models,
                                                                                  tiny_model_dir, data_dir,
                                                                                  tokenizer):
    generator = torch.Generator().manual_seed(4)

    def change(name, param):  # a Gaussian delta with a few outliers, where clipping pays
        if param.ndim == 2 and ".layers." in name:
            outliers = torch.rand(param.shape, generator=generator) < 0.002
            param.add_(torch.randn(param.shape, generator=generator) * 1e-3 + outliers * 0.05)

    finetune = make_finetune(change)
    base, tuned = models(tiny_model_dir), models(finetune)
    calibrated = dict(method="int4", calibration_samples=4, calibration="tiny_alpaca",
                      calibration_dir=str(data_dir), seq_len=32)
    plain = DeltaQuantizer(DeltaQuantConfig(**calibrated)).compress(base, tuned, tokenizer=tokenizer)
    clipped = DeltaQuantizer(DeltaQuantConfig(clip_percentile=99.9, **calibrated)).compress(base, tuned,
                                                                                             tokenizer=tokenizer)
    assert {e.params["clip_percentile"] for e in clipped.entries.values()} - {None}  # some layer chose to clip
    # The search includes "no clipping", so on the calibration data's weighting no layer can get worse.
    batches = calibration_batches(tokenizer, "tiny_alpaca", str(data_dir), 32, 1, 4, 42)
    grams = input_grams(tuned, batches, list(plain.entries))
    base_params, tuned_params = dict(base.named_parameters()), dict(tuned.named_parameters())
    for name, entry in clipped.entries.items():
        delta = tuned_params[name] - base_params[name]
        with_clip = weighted_error(dequantize(entry) - delta, grams[name])
        without = weighted_error(dequantize(plain.entries[name]) - delta, grams[name])
        assert with_clip <= without * (1 + 1e-9), name


def test_config_errors():
    with pytest.raises(ConfigError, match="Unknown DeltaQuant method 'int3'"):
        DeltaQuantConfig(method="int3")
    with pytest.raises(ConfigError, match="not both"):
        DeltaQuantConfig(layer_bits={"q_proj": "int8"}, bit_budget=4)
    with pytest.raises(ConfigError, match="between 1 and 8"):
        DeltaQuantConfig(bit_budget=12)
    assert DeltaQuantConfig(calibration_samples=8).calibration is None  # chosen when compression starts
    assert DeltaQuantConfig(method=QuantMethod.INT4).method is QuantMethod.INT4


@pytest.mark.parametrize("options, says", [
    ({"group_size": 0}, "'group_size' must be a whole number of at least 1 or None"),
    ({"clip_percentile": 40}, "'clip_percentile' must be in (50, 100] or None"),
    ({"clip_percentile": 100.5}, "'clip_percentile' must be in (50, 100]"),
    ({"seq_len": 0}, "'seq_len' must be a whole number of at least 1"),
    ({"calibration_samples": -1}, "'calibration_samples' must be a whole number of at least 0"),
    ({"bit_budget": "4"}, "between 1 and 8"), ({"per_channel": "no"}, "'per_channel' must be True or False"),
    ({"method": True}, "Unknown DeltaQuant method True"), ({"layer_bits": ["int8"]}, "'layer_bits' maps name patterns"),
])
def test_impossible_values_are_refused_naming_the_field_and_range(options, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        DeltaQuantConfig(**options)


def test_legitimate_edge_values_are_kept():
    config = DeltaQuantConfig(method=4, clip_percentile=100, group_size=1, bit_budget=1, seq_len=1)
    assert config.method is QuantMethod.INT4 and config.clip_percentile == 100
