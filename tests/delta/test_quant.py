"""DeltaQuant: every method's reconstruction rule, its error bound, and the options a user can get wrong."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load, save

from gym.core.errors import ConfigError
from gym.delta.tensor_quant import (
    BITS,
    Encoded,
    QuantMethod,
    dequantize,
    encoded_bytes,
    expand_scale,
    quantize,
    relative_error,
    signs,
)

# (granularity, group_size); 16 does not divide the 40-wide rows used below, 8 does.
UNITS = [("tensor", None), ("channel", None), ("group", 16), ("group", 8)]
INT_METHODS = [QuantMethod.INT8, QuantMethod.INT4, QuantMethod.INT2]


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def random_signs(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2, shape, generator=g).float() * 2 - 1


def units(shape: tuple[int, ...], granularity: str, group_size: int | None) -> list[tuple[torch.Tensor, tuple]]:
    """Reference split, written independently of the module: (flat element indices, grid index) per unit."""
    idx = torch.arange(math.prod(shape)).reshape(shape)
    if granularity == "tensor":
        return [(idx.reshape(-1), (0, 0))]
    if granularity == "channel":
        rows = idx.reshape(shape[0], -1) if len(shape) >= 2 else idx.reshape(1, -1)
        return [(row, (i, 0)) for i, row in enumerate(rows)]
    rows = idx.reshape(-1, shape[-1]) if shape else idx.reshape(1, 1)
    starts = range(0, rows.shape[1], group_size)
    return [(row[j : j + group_size], (i, j // group_size)) for i, row in enumerate(rows) for j in starts]


def per_element(grid: torch.Tensor, shape: tuple[int, ...], granularity: str, group_size: int | None) -> torch.Tensor:
    """A stored unit grid spread over the elements, via the reference split."""
    out = torch.empty(math.prod(shape))
    for flat, cell in units(shape, granularity, group_size):
        out[flat] = grid[cell].float()
    return out.reshape(shape)


# ---------------------------------------------------------------- binary (BitDelta)


@pytest.mark.parametrize("granularity,group_size", UNITS)
def test_binary_reconstructs_scaled_signs_exactly(granularity, group_size):
    s = random_signs(6, 40, seed=1)
    # Per-row magnitudes (a single one for the per-tensor case), all exact in float16.
    c = torch.full((6, 1), 0.375) if granularity == "tensor" else torch.arange(1, 7).float().unsqueeze(1) / 64
    delta = c * s
    enc = quantize(delta, "binary", granularity=granularity, group_size=group_size)
    assert torch.equal(dequantize(enc), delta)
    assert torch.equal(signs(enc), s)
    assert torch.equal(per_element(enc.tensors["scale"], (6, 40), granularity, group_size), c.expand(6, 40))


@pytest.mark.parametrize("granularity,group_size", UNITS)
def test_binary_zero_delta_gives_zero_alpha_and_exact_zeros(granularity, group_size):
    enc = quantize(torch.zeros(6, 40), "binary", granularity=granularity, group_size=group_size)
    assert torch.count_nonzero(enc.tensors["scale"]) == 0
    assert torch.equal(dequantize(enc), torch.zeros(6, 40))
    assert torch.equal(signs(enc), torch.ones(6, 40))  # sign(0) = +1


def test_binary_alpha_is_the_l2_optimal_scale_for_fixed_signs():
    delta = randn(32, 64, seed=2) * 1e-3
    enc = quantize(delta, QuantMethod.BINARY, granularity="tensor")
    alpha = enc.tensors["scale"].float().item()
    assert alpha == pytest.approx(delta.abs().mean().item(), rel=1e-3)  # float16 storage
    sign = torch.where(delta >= 0, 1.0, -1.0)

    def err(a: float) -> float:
        return (delta - a * sign).pow(2).sum().item()

    best = err(alpha)
    for factor in [0.8, 0.9, 0.95, 0.98, 0.99, 1.01, 1.02, 1.05, 1.1, 1.25]:
        assert best < err(alpha * factor)
    assert best == pytest.approx((dequantize(enc) - delta).pow(2).sum().item(), rel=1e-5)


@pytest.mark.parametrize("granularity,group_size", UNITS)
def test_binary_is_positively_homogeneous(granularity, group_size):
    delta = randn(6, 40, seed=3)
    base = quantize(delta, "binary", granularity=granularity, group_size=group_size)
    # A power of two scales float16 exactly, so the match is exact; other k match to float16 precision.
    scaled = quantize(4 * delta, "binary", granularity=granularity, group_size=group_size)
    assert torch.equal(dequantize(scaled), 4 * dequantize(base))
    scaled = quantize(3 * delta, "binary", granularity=granularity, group_size=group_size)
    assert torch.equal(signs(scaled), signs(base))
    torch.testing.assert_close(dequantize(scaled), 3 * dequantize(base), rtol=1e-3, atol=0)


@pytest.mark.parametrize("granularity,group_size", UNITS)
def test_expand_scale_spreads_the_grid_differentiably(granularity, group_size):
    x = randn(2, 3, 40, seed=20)
    enc = quantize(x, "binary", granularity=granularity, group_size=group_size)
    grid = enc.tensors["scale"].float().requires_grad_(True)
    spread = expand_scale(grid, enc)
    assert spread.shape == x.shape
    assert torch.equal(spread.detach(), per_element(enc.tensors["scale"], x.shape, granularity, group_size))
    assert torch.equal(spread.detach() * signs(enc), dequantize(enc))
    spread.sum().backward()  # each unit's gradient counts its elements
    counts = torch.zeros_like(grid)
    for idx, cell in units(x.shape, granularity, group_size):
        counts[cell] += len(idx)
    assert torch.equal(grid.grad, counts)


def test_binary_sizes():
    enc = quantize(randn(64, 96, seed=4), "binary", granularity="channel")
    assert enc.tensors["codes"].dtype == torch.uint8
    assert enc.tensors["codes"].numel() == 64 * 96 // 8
    assert enc.tensors["scale"].dtype == torch.float16 and enc.tensors["scale"].shape == (64, 1)
    assert encoded_bytes(enc) == 64 * 96 // 8 + 64 * 2


def test_signs_rejects_other_methods():
    with pytest.raises(ValueError, match="binary"):
        signs(quantize(randn(4, 8), "int4"))


# ---------------------------------------------------------------- error bounds per method


@pytest.mark.parametrize("granularity,group_size", UNITS)
@pytest.mark.parametrize("method", INT_METHODS)
@pytest.mark.parametrize("symmetric", [True, False])
# 1e-5 puts the scales in float16's subnormal range, where rounding them to nearest would clamp the extremes.
@pytest.mark.parametrize("magnitude", [1e-2, 1e-5])
def test_int_error_is_at_most_half_a_step(method, symmetric, granularity, group_size, magnitude):
    x = randn(6, 40, seed=5) * magnitude + (0 if symmetric else 0.3 * magnitude)
    enc = quantize(x, method, granularity=granularity, group_size=group_size, symmetric=symmetric)
    assert enc.tensors["scale"].dtype == torch.float16
    assert ("zero" in enc.tensors) == (not symmetric)
    step = per_element(enc.tensors["scale"], (6, 40), granularity, group_size)
    err = (dequantize(enc) - x).abs()
    assert (err <= step / 2 * (1 + 1e-5)).all()
    assert err.max() > 0  # a real test: quantization did lose something
    expected = {"granularity": granularity, "group_size": group_size, "symmetric": symmetric, "clip_percentile": None}
    assert enc.params == expected


@pytest.mark.parametrize("method", INT_METHODS)
def test_symmetric_int_grid_matches_the_formula(method):
    x = randn(5, 24, seed=6)
    enc = quantize(x, method, granularity="channel")
    qmax = 2 ** (BITS[method] - 1) - 1
    scale = enc.tensors["scale"].float()
    # Stored scale is max|x| / qmax rounded up to float16, so it is never below the float32 value.
    ideal = x.abs().amax(dim=1, keepdim=True) / qmax
    assert (scale >= ideal).all() and (scale <= ideal * (1 + 2**-10)).all()
    q = torch.round(x / scale).clamp(-qmax, qmax)
    assert torch.equal(dequantize(enc), q * scale)


def test_asymmetric_grid_matches_the_formula():
    x = randn(5, 24, seed=7) + 0.5
    enc = quantize(x, "int4", granularity="channel", symmetric=False)
    zero, scale = enc.tensors["zero"].float(), enc.tensors["scale"].float()
    assert (zero <= x.amin(dim=1, keepdim=True)).all()  # zero is the row minimum rounded down
    assert torch.allclose(zero, x.amin(dim=1, keepdim=True), rtol=2**-10)
    assert torch.allclose(scale, (x.amax(dim=1, keepdim=True) - zero) / 15, rtol=2**-10)
    code = torch.round((x - zero) / scale).clamp(0, 15)
    assert torch.equal(dequantize(enc), zero + code * scale)


def test_ternary_hand_example():
    x = torch.tensor([[0.1, -0.5, 0.02, 0.9], [0.0, 0.0, 0.0, 0.0], [-0.25, 0.25, -0.25, 0.25]])
    enc = quantize(x, "ternary", granularity="channel")
    # Row 0: t = 0.7 * 0.38 = 0.266 keeps -0.5 and 0.9, alpha = 0.7. Row 1: all zero. Row 2: t = 0.175 keeps
    # everything, alpha = 0.25.
    a = torch.tensor(0.7).half().float().item()
    expected = torch.tensor([[0.0, -a, 0.0, a], [0.0, 0.0, 0.0, 0.0], [-0.25, 0.25, -0.25, 0.25]])
    assert torch.equal(dequantize(enc), expected)
    assert enc.tensors["codes"].numel() == 3  # 12 entries x 2 bits


@pytest.mark.parametrize("granularity,group_size", UNITS)
def test_ternary_follows_the_twn_rule_per_unit(granularity, group_size):
    x = randn(6, 40, seed=8)
    enc = quantize(x, "ternary", granularity=granularity, group_size=group_size)
    flat, out = x.reshape(-1), dequantize(enc).reshape(-1)
    for idx, _ in units((6, 40), granularity, group_size):
        v = flat[idx]
        kept = v.abs() > 0.7 * v.abs().mean()
        alpha = torch.tensor(v.abs()[kept].mean().item()).half().float()
        assert torch.equal(out[idx], torch.where(kept, torch.sign(v) * alpha, torch.zeros(())))


@pytest.mark.parametrize("granularity,group_size", UNITS)
def test_binary_equals_alpha_times_sign_per_unit(granularity, group_size):
    x = randn(6, 40, seed=9)
    x[0, :3] = 0.0  # sign(0) = +1
    enc = quantize(x, "binary", granularity=granularity, group_size=group_size)
    flat, out = x.reshape(-1), dequantize(enc).reshape(-1)
    for idx, _ in units((6, 40), granularity, group_size):
        v = flat[idx]
        alpha = torch.tensor(v.abs().mean().item()).half().float()
        assert torch.equal(out[idx], torch.where(v >= 0, alpha, -alpha))


@pytest.mark.parametrize("method", list(QuantMethod))
@pytest.mark.parametrize("granularity,group_size", UNITS)
def test_zero_units_reconstruct_exactly(method, granularity, group_size):
    x = randn(6, 40, seed=10)
    x[2] = 0.0  # a zero channel, and zero groups
    enc = quantize(x, method, granularity=granularity, group_size=group_size)
    assert torch.isfinite(enc.tensors["scale"]).all()
    out = dequantize(enc)
    assert torch.isfinite(out).all()
    if granularity != "tensor":
        assert torch.equal(out[2], torch.zeros(40))
    zeros = quantize(torch.zeros(6, 40), method, granularity=granularity, group_size=group_size)
    assert torch.equal(dequantize(zeros), torch.zeros(6, 40))


def test_asymmetric_constant_unit_is_exact():
    x = randn(3, 16, seed=11)
    x[1] = 0.5
    enc = quantize(x, "int2", granularity="channel", symmetric=False)
    assert torch.equal(dequantize(enc)[1], torch.full((16,), 0.5))


# ---------------------------------------------------------------- accuracy ordering and clipping


def test_more_bits_less_error():
    x = randn(128, 256, seed=12)
    errs = [relative_error(x, quantize(x, m, granularity="channel")) for m in ("int8", "int4", "int2")]
    assert errs[0] < errs[1] < errs[2]
    assert errs[0] < 0.01


def test_clip_percentile_helps_int4_with_outliers_and_clamps_them():
    x = randn(64, 256, seed=13)
    outliers = [(0, 0), (10, 100), (30, 7), (63, 255)]
    for i, j in outliers:
        x[i, j] = 20.0
    plain = quantize(x, "int4", granularity="tensor")
    clipped = quantize(x, "int4", granularity="tensor", clip_percentile=99.9)
    assert relative_error(x, clipped) < 0.5 * relative_error(x, plain)
    scale = clipped.tensors["scale"].float().item()
    bulk = x.abs().flatten()
    assert scale * 7 == pytest.approx(torch.quantile(bulk, 0.999).item(), rel=1e-3)
    out = dequantize(clipped)
    for i, j in outliers:
        assert out[i, j].item() == pytest.approx(7 * scale)
    assert clipped.params["clip_percentile"] == 99.9


def test_asymmetric_clip_clamps_both_tails():
    x = randn(1, 2000, seed=14)
    x[0, 0], x[0, 1] = -30.0, 40.0
    enc = quantize(x, "int8", granularity="tensor", symmetric=False, clip_percentile=99.5)
    out = dequantize(enc)
    lo, hi = torch.quantile(x, 0.005).item(), torch.quantile(x, 0.995).item()
    assert out[0, 0].item() == pytest.approx(lo, abs=enc.tensors["scale"].float().item())
    assert out[0, 1].item() == pytest.approx(hi, abs=enc.tensors["scale"].float().item())


# ---------------------------------------------------------------- shapes, dtypes, storage


def test_unit_grid_shapes_and_odd_ranks():
    x = randn(6, 40, seed=15)
    assert quantize(x, "int8", granularity="tensor").tensors["scale"].shape == (1, 1)
    assert quantize(x, "int8", granularity="channel").tensors["scale"].shape == (6, 1)
    assert quantize(x, "int8", granularity="group", group_size=16).tensors["scale"].shape == (6, 3)
    assert quantize(randn(40), "int8", granularity="channel").tensors["scale"].shape == (1, 1)
    # Channels are slices along dim 0; groups run along the last dim of each row.
    x3 = randn(2, 3, 10, seed=16)
    assert quantize(x3, "int4", granularity="channel").tensors["scale"].shape == (2, 1)
    enc = quantize(x3, "int4", granularity="group", group_size=4)
    assert enc.tensors["scale"].shape == (6, 3)
    step = per_element(enc.tensors["scale"], (2, 3, 10), "group", 4)
    assert ((dequantize(enc) - x3).abs() <= step / 2 * (1 + 1e-5)).all()
    scalar = torch.tensor(0.25)
    assert torch.equal(dequantize(quantize(scalar, "binary")), scalar)


def test_group_size_only_matters_for_group_granularity():
    x = randn(6, 40, seed=21)
    enc = quantize(x, "int4", granularity="channel", group_size=16)
    assert enc.params["group_size"] is None
    assert torch.equal(dequantize(enc), dequantize(quantize(x, "int4", granularity="channel")))


@pytest.mark.parametrize("method,symmetric", [(m, True) for m in QuantMethod] + [(QuantMethod.INT4, False)])
def test_float32_input_is_never_modified(method, symmetric):
    x = randn(6, 40, seed=22)  # float32: quantize works on the caller's own storage, not a copy
    before = x.clone()
    quantize(x, method, granularity="group", group_size=16, symmetric=symmetric)
    assert torch.equal(x, before)


def test_low_precision_input_and_output_dtype():
    x = randn(8, 32, seed=17).to(torch.bfloat16)
    before = x.clone()
    enc = quantize(x, "int8", granularity="group", group_size=32)
    assert torch.equal(x, before)  # input untouched
    as_float = quantize(x.float(), "int8", granularity="group", group_size=32)
    assert torch.equal(enc.tensors["codes"], as_float.tensors["codes"])
    out = dequantize(enc, dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16 and out.shape == (8, 32)
    assert relative_error(x, enc) < 0.01


def test_relative_error_definition():
    x = randn(8, 32, seed=18)
    enc = quantize(x, "int4")
    expected = torch.linalg.vector_norm(dequantize(enc) - x) / torch.linalg.vector_norm(x)
    assert relative_error(x, enc) == pytest.approx(expected.item(), rel=1e-6)
    assert relative_error(torch.zeros(3, 4), quantize(torch.zeros(3, 4), "int4")) == 0.0


@pytest.mark.parametrize(
    "method,symmetric", [(m, True) for m in QuantMethod] + [(m, False) for m in INT_METHODS]
)
def test_dequantize_is_bit_identical_after_save_and_load(method, symmetric):
    x = randn(12, 50, seed=19) * 3e-4
    enc = quantize(x, method, granularity="group", group_size=16, symmetric=symmetric)
    reference = dequantize(enc)
    loaded = load(save(enc.tensors))
    assert all(loaded[k].dtype == v.dtype for k, v in enc.tensors.items())
    halves = {k: (v.float().half() if v.is_floating_point() else v) for k, v in loaded.items()}
    again = Encoded(method=QuantMethod(method.value), shape=tuple(enc.shape), tensors=halves, params=dict(enc.params))
    assert torch.equal(dequantize(again), reference)


def test_truncated_codes_raise():
    enc = quantize(randn(4, 8), "int4")
    enc.tensors["codes"] = enc.tensors["codes"][:-1]
    with pytest.raises(ValueError, match="truncated"):
        dequantize(enc)


# ---------------------------------------------------------------- user errors


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_input_is_a_config_error(bad):
    x = randn(4, 8)
    x[1, 2] = bad
    with pytest.raises(ConfigError, match="NaN or Inf"):
        quantize(x, "int8")


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"method": "int3"}, "int8, int4, int2, ternary, binary"),
        ({"method": "int8", "granularity": "row"}, "tensor, channel, group"),
        ({"method": "int8", "granularity": "group"}, "group_size >= 1"),
        ({"method": "int8", "granularity": "group", "group_size": 0}, "group_size >= 1"),
        ({"method": "binary", "symmetric": False}, "binary has no symmetric"),
        ({"method": "ternary", "clip_percentile": 99.0}, "ternary has no symmetric"),
        ({"method": "int4", "clip_percentile": 40.0}, r"\(50, 100\]"),
    ],
)
def test_bad_options_are_config_errors(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        quantize(randn(4, 8), **kwargs)


def test_non_float_and_empty_inputs_are_config_errors():
    with pytest.raises(ConfigError, match="floating-point"):
        quantize(torch.ones(4, 8, dtype=torch.int32), "int8")
    with pytest.raises(ConfigError, match="empty"):
        quantize(torch.zeros(0, 8), "int8")
