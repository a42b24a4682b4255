"""The decode kernels: weight packing (int8 in groups of 16 interleaved rows, and int4 on llama.cpp's Q4_1
grid), the compiled C++ ops against plain torch math, and the torch reference path that runs where nothing
could be compiled.

Every tensor comes from a seeded generator, so the tests are deterministic; the shapes are small, so the whole
file runs in seconds once the kernels are built (a first build on a new machine takes longer).
"""

from __future__ import annotations

import math

import pytest
import torch

from gym.infer.fast import kernels

BLOCK, GROUP = kernels.BLOCK, kernels.GROUP
# Rows share each weight load four (float, AVX2) or eight (AVX512-VNNI) at a time: every remainder shows up.
ROWS = (1, 2, 3, 5, 8, 9, 16, 17, 40)  # 8 and 40: the pair loop on AVX-512 (linear.cpp, wide_rows)
QUANT_SHAPES = ((48, 96), (64, 64), (16, 32))  # (N, K): N % 16 == 0, K % 32 == 0
FLOAT_SHAPES = ((36, 96), (64, 64), (36, 70), (37, 70), (3, 5))  # float kernels take any N and K


def randn(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def rand(*shape: int, seed: int, low: float, high: float) -> torch.Tensor:
    return low + (high - low) * torch.rand(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.fixture()
def reference_path(monkeypatch):
    """Force the torch reference (what a machine without a compiler runs)."""
    monkeypatch.setitem(kernels._state, "ok", False)


# -- plain torch math, written independently of kernels.py ------------------------------------------------
def block_view(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(t.shape[0], t.shape[1] // BLOCK, BLOCK)


def expand_scales(scale: torch.Tensor) -> torch.Tensor:
    """[N, K/32] per-block scales -> [N, K], one per weight."""
    return scale.float().repeat_interleave(BLOCK, dim=1)


def ungroup(t: torch.Tensor, k: int) -> torch.Tensor:
    """Int8 codes in the kernels' layout [N/16][K/32][8 quads][16 rows][4] (as csrc/linear.cpp reads them)
    -> row-major [N, K]."""
    n = t.shape[0]
    view = t.reshape(n // GROUP, k // BLOCK, BLOCK // 4, GROUP, 4)
    out = torch.empty(n, k, dtype=t.dtype)
    for g in range(n // GROUP):
        for j in range(k // BLOCK):
            for quad in range(BLOCK // 4):
                for o in range(GROUP):
                    start = j * BLOCK + quad * 4
                    out[g * GROUP + o, start:start + 4] = view[g, j, quad, o]
    return out


def group_params(params: torch.Tensor, count: int) -> list[torch.Tensor]:
    """Per-block parameters stored [N/16][blocks][count][16] (int8: the scales; int4: the steps, then the
    minimums) -> `count` tensors [N, blocks] float32."""
    n = params.shape[0]
    blocks = params.shape[1] // count
    view = params.float().reshape(n // GROUP, blocks, count, GROUP)
    out = [torch.empty(n, blocks) for _ in range(count)]
    for g in range(n // GROUP):
        for j in range(blocks):
            for i in range(count):
                for o in range(GROUP):
                    out[i][g * GROUP + o, j] = view[g, j, i, o]
    return out


def quantize_like_kernel(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The C++ activation quantizer: scale = max|x| / 127 per block, q = nearbyint(x * (1 / scale))."""
    blocks = block_view(x)
    scale = blocks.abs().amax(-1) / 127
    inverse = torch.where(scale > 0, 1 / scale, torch.zeros_like(scale))
    q = torch.round(blocks * inverse[..., None])
    return q.reshape(x.shape), scale


def quant_linear_exact(x: torch.Tensor, dense_weight: torch.Tensor) -> torch.Tensor:
    """What the integer kernels compute, in float64: the C++-quantized activations times the dequantized weight."""
    q, scale = quantize_like_kernel(x)
    return (q.double() * expand_scales(scale).double()) @ dense_weight.double().T


def quant_error_bound(x: torch.Tensor, w: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    """|x @ w.T - xq @ wq.T| <= |dx| @ |w|.T + |xq| @ |dw|.T, with |dx| <= half an activation step."""
    _, xscale = quantize_like_kernel(x)
    dx = expand_scales(xscale).double() / 2
    return dx @ w.double().abs().T + (x.double().abs() + dx) @ (w.double() - dense.double()).abs().T


def rms_norm_math(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


def rope_math(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int) -> torch.Tensor:
    out = x.clone().double()
    half = x.shape[-1] // 2
    for t in range(x.shape[0]):
        for h in range(heads):
            v = x[t, h].double()
            rotated = torch.cat([-v[half:], v[:half]])
            out[t, h] = v * cos[t].double() + rotated * sin[t].double()
    return out


def attention_math(q, keys, values, lengths, scale):
    """Per row and head: softmax(q . K[0..len] * scale) @ V[0..len], query head h reading kv head h // group."""
    rows, heads, dim = q.shape
    group = heads // keys.shape[1]
    out = torch.empty(rows, heads, dim, dtype=torch.float64)
    for r in range(rows):
        n = int(lengths[r]) + 1
        for h in range(heads):
            k = keys[r, h // group, :n].double()
            v = values[r, h // group, :n].double()
            weights = torch.softmax(k @ q[r, h].double() * scale, dim=0)
            out[r, h] = weights @ v
    return out


def silu_mul_math(gate_up: torch.Tensor) -> torch.Tensor:
    width = gate_up.shape[-1] // 2
    gate, up = gate_up[..., :width].double(), gate_up[..., width:].double()
    return gate * torch.sigmoid(gate) * up


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30))


def attention_case(seed: int):
    """Three rows of different lengths (0, 3, 7) in a four-slot cache whose unused positions hold noise."""
    rows, slots, heads, kv_heads, dim, capacity = 3, 4, 4, 2, 8, 10
    q = randn(rows, heads, dim, seed=seed)
    k = randn(rows, kv_heads, dim, seed=seed + 1)
    v = randn(rows, kv_heads, dim, seed=seed + 2)
    keys = randn(slots, kv_heads, capacity, dim, seed=seed + 3)
    values = randn(slots, kv_heads, capacity, dim, seed=seed + 4)
    lengths = torch.tensor([0, 3, 7])
    return q, k, v, keys, values, lengths, dim ** -0.5


def expected_cache(cache: torch.Tensor, new: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    out = cache.clone()
    for r in range(new.shape[0]):
        out[r, :, int(lengths[r])] = new[r]
    return out


def rope_tables(tokens: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Llama-style tables (cos/sin of position * inverse frequency, halves repeated) at arbitrary positions."""
    positions = torch.tensor([3.0, 17.0, 250.0, 0.0, 1.0])[:tokens]
    inverse = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    freqs = positions[:, None] * inverse[None, :]
    angles = torch.cat([freqs, freqs], dim=-1)
    return angles.cos(), angles.sin()


def test_the_kernels_build_wherever_a_compiler_is_present():
    """The compiled-kernel tests skip where nothing could be compiled; a source that fails to compile must not
    pass for that case (it would leave every machine on the slow reference path)."""
    status = kernels.kernel_status()
    if status is not None and not status.startswith("the kernels did not build"):
        pytest.skip(f"nothing to compile with here ({status})")
    assert status is None


# -- packing ----------------------------------------------------------------------------------------------
def test_packable_needs_whole_groups_and_blocks():
    assert kernels.packable(torch.zeros(48, 96))
    assert kernels.packable(torch.zeros(16, 32))
    assert not kernels.packable(torch.zeros(36, 96))  # N not a multiple of GROUP
    assert not kernels.packable(torch.zeros(48, 70))  # K not a multiple of BLOCK
    assert not kernels.packable(torch.zeros(48, 16))
    assert not kernels.packable(torch.zeros(96))  # not a matrix
    assert not kernels.packable(torch.zeros(2, 4, 32))


@pytest.mark.parametrize(("n", "k"), QUANT_SHAPES)
@pytest.mark.parametrize("magnitude", [1.0, 0.02])  # 0.02: the size of real LLM weights
def test_int8_round_trip_within_half_a_step(n, k, magnitude):
    w = randn(n, k, seed=n + k, scale=magnitude)
    q, scale = kernels.pack_int8(w)
    assert q.dtype == torch.int8 and q.shape == (n, k)
    assert scale.dtype == torch.float16 and scale.shape == (n, k // BLOCK)
    (rows_scale,) = group_params(scale, 1)
    # One scale per block of 32: max|w| / 127 (in float16).
    torch.testing.assert_close(rows_scale, (block_view(w).abs().amax(-1) / 127).half().float(), rtol=0, atol=0)
    assert q.abs().max() <= 127
    err = (kernels.unpack_int8(q, scale) - w).abs()
    step = expand_scales(rows_scale)
    assert torch.all(err <= step / 2 + 1e-6 * w.abs().max()), float((err - step / 2).max())


def min_max_fit_error(w: torch.Tensor) -> torch.Tensor:
    """Each block's squared error for Q4_1's plain fit: minimum and (max - min) / 15 as float16, nearest code."""
    blocks = block_view(w)
    low = blocks.amin(-1).half().float()
    step = ((blocks.amax(-1) - blocks.amin(-1)) / 15).half().float()
    inverse = torch.where(step != 0, 1 / step, torch.zeros_like(step))
    codes = torch.round((blocks - low[..., None]) * inverse[..., None]).clamp(0, 15)
    return ((codes * step[..., None] + low[..., None] - blocks) ** 2).sum(-1)


@pytest.mark.parametrize(("n", "k"), QUANT_SHAPES)
@pytest.mark.parametrize("magnitude", [1.0, 0.02])
def test_int4_round_trip_is_a_fitted_q4_1_grid(n, k, magnitude):
    w = randn(n, k, seed=100 + n + k, scale=magnitude)
    packed, params = kernels.pack_int4(w)
    assert packed.dtype == torch.uint8 and packed.shape == (n, k // 2)
    assert params.dtype == torch.float16 and params.shape == (n, 2 * k // BLOCK)
    step, low = group_params(params, 2)
    dense = kernels.unpack_int4(packed, params)
    # Every weight is a code 0..15 of its block's grid.
    codes = (block_view(dense) - low[..., None]) / torch.where(step > 0, step, 1)[..., None]
    torch.testing.assert_close(codes, codes.round().clamp(0, 15), rtol=0, atol=1e-3)
    # The least-squares refits only ever lower a block's error below Q4_1's plain min/max fit ...
    error = ((block_view(dense) - block_view(w)) ** 2).sum(-1)
    plain = min_max_fit_error(w)
    assert torch.all(error <= plain * (1 + 1e-5) + 1e-12)
    # ... and lower it well overall: on Gaussian weights by >= 10% (measured: ~12%).
    assert float(error.sum()) <= 0.9 * float(plain.sum())
    # Which leaves less error than one symmetric scale per block (Q4_0's max|w| / 8; measured: ~30% less).
    blocks = block_view(w)
    extreme = blocks.gather(-1, blocks.abs().argmax(-1, keepdim=True)).squeeze(-1)
    sym_step = (extreme / -8).half().float()
    sym = torch.round(blocks / sym_step[..., None]).clamp(-8, 7) * sym_step[..., None]
    assert float(error.sum()) <= 0.8 * float(((sym - blocks) ** 2).sum())


def test_int4_weights_already_on_a_q4_1_grid_come_back_exact():
    """A model converted from a Q4_1 GGUF (the embedded SmolLM2 is one) holds exactly such weights."""
    n, k = 16, 64
    step = rand(n, k // BLOCK, seed=31, low=0.001, high=0.01).half().float()
    low = rand(n, k // BLOCK, seed=32, low=-0.08, high=-0.01).half().float()
    codes = torch.randint(0, 16, (n, k // BLOCK, BLOCK), generator=torch.Generator().manual_seed(33)).float()
    codes[..., 0], codes[..., 1] = 0, 15  # each block spans the whole grid, as a Q4_1 block does
    w = (codes * step[..., None] + low[..., None]).reshape(n, k)
    assert torch.equal(kernels.unpack_int4(*kernels.pack_int4(w)), w)
    constant = torch.full((16, 32), -0.25)  # one value: step 0, the minimum is the value
    assert torch.equal(kernels.unpack_int4(*kernels.pack_int4(constant)), constant)


@pytest.mark.parametrize("magnitude", [1e-4, 1e-5, 1e-6, 1e-8])
def test_tiny_weights_lose_precision_only_to_float16_scales(magnitude):
    """Below max|w| ~ 8e-3 a block's scale is a float16 subnormal (spacing 2**-24) and below ~4e-6 it is 0:
    the error stays within half a step plus what rounding the scale to float16 can cost (127 or 15 codes times
    half the subnormal spacing), and nothing becomes nan or inf."""
    n, k = 16, 128
    w = randn(n, k, seed=200, scale=magnitude)
    slack = 2.0 ** -25
    q, scale = kernels.pack_int8(w)
    dense = kernels.unpack_int8(q, scale)
    step = expand_scales(group_params(scale, 1)[0])
    assert torch.isfinite(dense).all()
    assert torch.all((dense - w).abs() <= step / 2 + 127 * slack + 1e-12)
    dense = kernels.unpack_int4(*kernels.pack_int4(w))
    assert torch.isfinite(dense).all()
    # Squared error per block at most the plain min/max fit's, which rounds within half a step plus the
    # float16 rounding of the step (15 codes) and of the minimum.
    error = ((block_view(dense) - block_view(w)) ** 2).sum(-1)
    plain_step = (block_view(w).amax(-1) - block_view(w).amin(-1)) / 15
    per_weight = plain_step / 2 + 16 * slack + 1e-12
    assert torch.all(error <= BLOCK * per_weight ** 2 * (1 + 1e-5))


def test_int8_layout_is_groups_of_16_rows_by_quads():
    """Per group of 16 rows and block of 32 inputs: eight quads of 4 inputs, each the 16 rows' 4 codes side by
    side ([N/16][K/32][8][16][4]); scales [N/16][K/32][16]."""
    n, k = 32, 96
    w = randn(n, k, seed=7)
    q, scale = kernels.pack_int8(w)
    row_scale = (block_view(w).abs().amax(-1) / 127).half()
    row_q = torch.round(block_view(w) / row_scale.float()[..., None]).clamp(-127, 127).to(torch.int8).reshape(n, k)
    q_groups = q.reshape(n // GROUP, k // BLOCK, BLOCK // 4, GROUP, 4)
    s_groups = scale.reshape(n // GROUP, k // BLOCK, GROUP)
    for g in range(n // GROUP):
        for j in range(k // BLOCK):
            for o in range(GROUP):
                assert s_groups[g, j, o] == row_scale[GROUP * g + o, j]
                for quad in range(BLOCK // 4):
                    start = j * BLOCK + 4 * quad
                    assert torch.equal(q_groups[g, j, quad, o], row_q[GROUP * g + o, start:start + 4])


def test_int4_layout_puts_quad_c_plus_4_in_the_high_nibbles_of_quad_c():
    """The int8 layout's quads 0-3 in the low nibbles and quads 4-7 in the high nibbles of 4 x 64 bytes per
    group and block, each weight as its code 0..15; the parameters are [N/16][K/32][2][16]: the group's 16
    steps, then its 16 minimums."""
    n, k = 32, 64
    w = randn(n, k, seed=8)
    packed, params = kernels.pack_int4(w)
    dense = kernels.unpack_int4(packed, params)
    p_groups = packed.reshape(n // GROUP, k // BLOCK, 4, GROUP, 4)
    s_groups = params.reshape(n // GROUP, k // BLOCK, 2, GROUP)
    for g in range(n // GROUP):
        for j in range(k // BLOCK):
            for o in range(GROUP):
                step, low = s_groups[g, j, :, o].float()
                row = dense[GROUP * g + o, j * BLOCK:(j + 1) * BLOCK]
                codes = torch.round((row - low) / step).to(torch.uint8)
                for c in range(4):
                    byte = p_groups[g, j, c, o]
                    assert torch.equal(byte & 0x0F, codes[4 * c:4 * c + 4])
                    assert torch.equal(byte >> 4, codes[4 * c + 16:4 * c + 20])


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_packing_reorders_storage_but_unpack_restores_rows(fmt):
    n = 32
    # Row r is the constant r + 1 in its first block and -(r + 1) / 2 in its second: every row is distinct.
    w = torch.cat([torch.arange(1, n + 1.0)[:, None].expand(n, BLOCK),
                   -torch.arange(1, n + 1.0)[:, None].expand(n, BLOCK) / 2], dim=1).contiguous()
    pack, unpack = (kernels.pack_int8, kernels.unpack_int8) if fmt == "int8" else (kernels.pack_int4,
                                                                                    kernels.unpack_int4)
    weights, scale = pack(w)
    # Stored by groups of rows, the scales are not in row order.
    if fmt == "int8":  # row 0 of the storage holds rows 0 and 1, block 0
        (rows_scale,) = group_params(scale, 1)
        assert not torch.equal(scale, rows_scale)
        assert scale[0, 0] == rows_scale[0, 0] and scale[0, 1] == rows_scale[1, 0] and scale[1, 0] == rows_scale[2, 0]
        assert torch.equal(rows_scale[:, 0], 2 * rows_scale[:, 1])
    else:  # 4 per storage row: block 0's steps of rows 0-15 (storage rows 0-3), their minimums (4-7), block 1's
        step, low = group_params(scale, 2)
        assert torch.equal(scale[4].float(), low[:4, 0]) and torch.equal(scale[12].float(), low[:4, 1])
        assert not torch.equal(scale.float(), torch.stack([step, low], dim=-1).reshape(n, -1))
        assert torch.equal(low[:, 0], -2 * low[:, 1])  # constant blocks: step 0, the minimum is the value
        assert torch.all(step == 0)
    dense = unpack(weights, scale)
    torch.testing.assert_close(dense, w, rtol=2e-3, atol=0)
    # Row for row: each restored row is the nearest original row.
    nearest = torch.cdist(dense, w).argmin(dim=1)
    assert torch.equal(nearest, torch.arange(n))


def test_pack_handles_zero_blocks():
    w = torch.zeros(16, 64)
    w[1, 40] = 3.0
    dense = kernels.unpack_int8(*kernels.pack_int8(w))
    assert torch.isfinite(dense).all()
    torch.testing.assert_close(dense, w, rtol=1e-3, atol=0)
    # int4 fits (step, minimum) by least squares, so zeros may move by a hair to bring the 3 closer.
    dense = kernels.unpack_int4(*kernels.pack_int4(w))
    assert torch.isfinite(dense).all()
    torch.testing.assert_close(dense, w, rtol=1e-3, atol=1e-4)
    assert torch.all(dense[torch.arange(16) != 1] == 0)  # all-zero blocks stay exactly zero


def _packing_inputs() -> list[torch.Tensor]:
    """Gaussian rows at several magnitudes, heavy tails, a block of zeros, a constant block, a Q4_1 grid, and
    values whose rounding lands on ties (multiples of half a step)."""
    gaussian = torch.cat([randn(16, 256, seed=30, scale=s) for s in (1e-6, 0.02, 1.0, 300.0)])
    tails = randn(32, 128, seed=31) ** 3
    special = randn(16, 96, seed=32)
    special[0, :32] = 0
    special[1, :32] = 0.37
    grid = (torch.randint(0, 16, (16, 64), generator=torch.Generator().manual_seed(33)).float() * 0.125 - 1.0)
    ties = torch.randint(-254, 255, (16, 64), generator=torch.Generator().manual_seed(34)).float() / 2
    return [gaussian, tails, special, grid, ties]


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_compiled_packing_gives_the_references_bytes(ops, monkeypatch, fmt):
    """The packer in C++ (each instruction-set variant) and the torch reference make the same bytes, so a model
    packs the same with and without the compiled kernels, and a cache made by one is right for the other."""
    pack = kernels.pack_int8 if fmt == "int8" else kernels.pack_int4
    for weight in _packing_inputs():
        compiled = pack(weight)
        with monkeypatch.context() as patch:
            patch.setitem(kernels._state, "ok", False)
            reference = pack(weight)
        assert all(torch.equal(a, b) for a, b in zip(compiled, reference, strict=True)), weight.shape


# -- compiled kernels against plain torch ------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("n", "k"), FLOAT_SHAPES)
@pytest.mark.parametrize("rows", ROWS)
def test_compiled_linear_float(ops, rows, n, k, dtype):
    x = randn(rows, k, seed=rows * 1000 + n + k)
    w = randn(n, k, seed=rows * 1000 + n + k + 1).to(dtype)
    got = ops.linear(x, w)
    assert got.dtype == torch.float32 and got.shape == (rows, n)
    want = x.double() @ w.double().T
    magnitude = x.double().abs() @ w.double().abs().T
    assert torch.all((got.double() - want).abs() <= 1e-5 * magnitude + 1e-6), float((got.double() - want).abs().max())
    assert torch.equal(kernels.linear_float(x, w), got)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize(("n", "k"), QUANT_SHAPES)
@pytest.mark.parametrize("rows", ROWS)
def test_compiled_linear_quantized(ops, rows, n, k, fmt):
    x = randn(rows, k, seed=rows * 1000 + n + k + 2)
    w = randn(n, k, seed=rows * 1000 + n + k + 3)
    if fmt == "int8":
        weights, scale = kernels.pack_int8(w)
        dense, op, module_fn = kernels.unpack_int8(weights, scale), ops.linear_q8, kernels.linear_int8
    else:
        weights, scale = kernels.pack_int4(w)
        dense, op, module_fn = kernels.unpack_int4(weights, scale), ops.linear_q4, kernels.linear_int4
    got = op(x, weights, scale)
    assert got.dtype == torch.float32 and got.shape == (rows, n)
    # Against the torch reference's own math (what a machine without the kernels computes).
    assert rel_err(got, kernels.quantize_activations(x).double() @ dense.double().T) < 1e-3
    # Tightly, against the same activation rounding as the kernel: only float summation order differs.
    q, xscale = quantize_like_kernel(x)
    exact = quant_linear_exact(x, dense)
    magnitude = (q.abs().double() * expand_scales(xscale).double()) @ dense.double().abs().T
    assert torch.all((got.double() - exact).abs() <= 1e-5 * magnitude + 1e-6)
    # And within the quantization error of the float product.
    err = (got.double() - x.double() @ w.double().T).abs()
    assert torch.all(err <= quant_error_bound(x, w, dense) * (1 + 1e-4) + 1e-5)
    assert torch.equal(module_fn(x, weights, scale), got)


@pytest.mark.parametrize("rows", [1, 7])
def test_compiled_linear_large_shapes_split_across_threads(ops, rows):
    """Shapes big enough for ATen's parallel_for to cut the output features into several chunks."""
    n, k = 1028, 512
    x = randn(rows, k, seed=300 + rows)
    w = randn(n, k, seed=301 + rows)
    for dtype in (torch.float32, torch.bfloat16):
        wd = w.to(dtype)
        want = x.double() @ wd.double().T
        got = ops.linear(x, wd)
        assert torch.all((got.double() - want).abs() <= 1e-5 * (x.double().abs() @ wd.double().abs().T) + 1e-6)
    n = 1024
    for pack, unpack, op in ((kernels.pack_int8, kernels.unpack_int8, ops.linear_q8),
                             (kernels.pack_int4, kernels.unpack_int4, ops.linear_q4)):
        weights, scale = pack(w[:n])
        assert rel_err(op(x, weights, scale), quant_linear_exact(x, unpack(weights, scale))) < 1e-5


def test_compiled_linear_prompt_rows_cross_row_blocks_and_equal_each_row_alone(ops):
    """A prompt's rows are taken a block at a time (the block's rows stay in L2: 112 float rows or ~450 int8 rows
    at K = 576). Every row crosses or ends a block somewhere here, and each must equal its one-row product bit for
    bit: a prompt's numbers may not depend on how many rows share the call."""
    n, k, rows = 48, 576, 461
    x = randn(rows, k, seed=400)
    w = randn(n, k, seed=401)
    picked = [0, 111, 112, 113, 223, 224, 447, 448, 451, 452, 455, 456, 460]
    got = ops.linear(x, w)
    want = x.double() @ w.double().T
    assert torch.all((got.double() - want).abs() <= 1e-5 * (x.double().abs() @ w.double().abs().T) + 1e-6)
    for r in picked:
        assert torch.equal(got[r], ops.linear(x[r:r + 1], w)[0]), r
    # Many rows take another loop on AVX-512 (two rows per register, weights in panels): the same bits for every
    # weight format, for a width that leaves a scalar tail, and for a weight count that leaves a partial tile.
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for width, count in ((576, 48), (77, 61)):
            xd, wd = randn(rows, width, seed=402), randn(count, width, seed=403).to(dtype)
            together = ops.linear(xd, wd)
            for r in picked:
                assert torch.equal(together[r], ops.linear(xd[r:r + 1], wd)[0]), (dtype, width, r)
    for pack, op in ((kernels.pack_int8, ops.linear_q8), (kernels.pack_int4, ops.linear_q4)):
        weights, scale = pack(w)
        together = op(x, weights, scale)
        for r in picked:
            assert torch.equal(together[r], op(x[r:r + 1], weights, scale)[0]), (op, r)


def test_compiled_linear_decode_rows_taken_in_pieces_equal_the_same_rows_in_a_prompt(ops):
    """A decode step's few float rows are split between the threads in pieces of ~256 KB of weights taken in turn
    (any thread may compute any piece): 2,000 weight rows of 576 are 18 pieces, the last tile partial. Every
    output must equal the float64 product within float32's bound, and a row's outputs must be the same bits as
    that row's in a many-row call, which splits the weights in fixed ranges, and as in a call with another row
    count; for every weight format. Two threads, as on the machines measured (a pytest worker computes on one,
    and one thread takes no pieces)."""
    n, k = 2000, 576
    x = randn(9, k, seed=500)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        _check_pieces(ops, x, n, k)
    finally:
        torch.set_num_threads(threads)


def _check_pieces(ops, x: torch.Tensor, n: int, k: int) -> None:
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        w = randn(n, k, seed=501).to(dtype)
        one = ops.linear(x[:1], w)
        want = x[:1].double() @ w.double().T
        assert torch.all((one.double() - want).abs() <= 1e-5 * (x[:1].double().abs() @ w.double().abs().T) + 1e-6)
        many = ops.linear(x, w)
        assert torch.equal(one[0], many[0]), dtype
        for rows in (2, 3, 4):
            assert torch.equal(ops.linear(x[:rows], w), many[:rows]), (dtype, rows)


def test_compiled_linear_quantized_zero_activation_blocks(ops):
    x = randn(5, 96, seed=11)
    x[0] = 0  # a whole row of zeros
    x[2, 32:64] = 0  # one block of zeros (its scale is 0)
    w = randn(48, 96, seed=12)
    for pack, unpack, op in ((kernels.pack_int8, kernels.unpack_int8, ops.linear_q8),
                             (kernels.pack_int4, kernels.unpack_int4, ops.linear_q4)):
        weights, scale = pack(w)
        got = op(x, weights, scale)
        assert torch.isfinite(got).all()
        assert torch.all(got[0] == 0)
        assert rel_err(got, quant_linear_exact(x, unpack(weights, scale))) < 1e-5


def test_compiled_linear_rejects_bad_shapes(ops):
    x = randn(2, 64, seed=13)
    weights, scale = kernels.pack_int8(randn(16, 64, seed=14))
    with pytest.raises(RuntimeError, match="does not match"):
        ops.linear_q8(randn(2, 96, seed=15), weights, scale)
    with pytest.raises(RuntimeError, match="int8"):
        ops.linear_q8(x, weights.view(torch.uint8), scale)
    with pytest.raises(RuntimeError, match="float16"):
        ops.linear_q8(x, weights, scale.float())
    with pytest.raises(RuntimeError, match="dtype"):
        ops.linear(x, randn(8, 64, seed=16).double())


@pytest.mark.parametrize("shape", [(1, 64), (5, 96), (2, 3, 48)])
def test_compiled_rms_norm(ops, shape):
    x = randn(*shape, seed=sum(shape), scale=3.0)
    weight = rand(shape[-1], seed=sum(shape) + 1, low=0.5, high=1.5)
    got = ops.rms_norm(x, weight, 1e-6)
    assert got.shape == x.shape
    torch.testing.assert_close(got.double(), rms_norm_math(x, weight, 1e-6), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(kernels.rms_norm(x, weight, 1e-6), got, rtol=0, atol=0)
    # eps matters where the row is tiny.
    small = torch.full((1, 8), 1e-4)
    torch.testing.assert_close(ops.rms_norm(small, torch.ones(8), 1e-6).double(),
                               rms_norm_math(small, torch.ones(8), 1e-6), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("tables", ["llama", "random"])
def test_compiled_rope_rotates_only_the_first_heads(ops, tables):
    tokens, all_heads, heads, dim = 5, 6, 4, 16
    x = randn(tokens, all_heads, dim, seed=21)
    if tables == "llama":
        cos, sin = rope_tables(tokens, dim)
    else:  # halves that differ: the kernel must read cos/sin at i and i + dim/2
        cos, sin = randn(tokens, dim, seed=22), randn(tokens, dim, seed=23)
    before = x.clone()
    want = rope_math(x, cos, sin, heads)
    assert ops.rope_(x, cos, sin, heads) is None
    torch.testing.assert_close(x[:, :heads].double(), want[:, :heads], rtol=1e-5, atol=1e-6)
    assert torch.equal(x[:, heads:], before[:, heads:])
    # Through the module function too (dispatching to the compiled op).
    again = before.clone()
    kernels.rope_(again, cos, sin, heads)
    assert torch.equal(again, x)


def test_compiled_silu_mul(ops):
    gate_up = randn(5, 48, seed=31, scale=4.0)
    gate_up[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -20.0])  # exp overflow must not give nan
    got = ops.silu_mul(gate_up)
    assert got.shape == (5, 24)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), silu_mul_math(gate_up), rtol=1e-5, atol=1e-6)
    assert torch.equal(kernels.silu_mul(gate_up), got)


def test_compiled_decode_attention(ops):
    q, k, v, keys, values, lengths, scale = attention_case(seed=41)
    want_keys, want_values = expected_cache(keys, k, lengths), expected_cache(values, v, lengths)
    got = ops.decode_attention(q, k, v, keys, values, lengths, scale)
    assert got.shape == q.shape
    # The new k/v went to position lengths[r] of slot r, and nothing else changed (slot 3 is not a row).
    assert torch.equal(keys, want_keys)
    assert torch.equal(values, want_values)
    want = attention_math(q, want_keys, want_values, lengths, scale)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    # Row 0 (length 0) sees only its own new value: the output is v of its kv head.
    torch.testing.assert_close(got[0], v[0].repeat_interleave(2, dim=0), rtol=1e-6, atol=1e-6)


def test_compiled_decode_attention_agrees_with_module_and_reference(ops, monkeypatch):
    q, k, v, keys, values, lengths, scale = attention_case(seed=51)
    keys_ref, values_ref = keys.clone(), values.clone()
    compiled = kernels.decode_attention(q, k, v, keys, values, lengths, scale)
    monkeypatch.setitem(kernels._state, "ok", False)
    reference = kernels.decode_attention(q, k, v, keys_ref, values_ref, lengths, scale)
    assert torch.equal(keys, keys_ref) and torch.equal(values, values_ref)
    torch.testing.assert_close(compiled, reference, rtol=1e-5, atol=1e-6)


def test_compiled_decode_attention_refuses_a_full_cache(ops):
    q, k, v, keys, values, _, scale = attention_case(seed=61)
    with pytest.raises(RuntimeError, match="full"):
        ops.decode_attention(q, k, v, keys, values, torch.tensor([0, 3, keys.shape[2]]), scale)


@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (10, 2, 72), (6, 3, 5), (5, 1, 64), (2, 2, 16)])
def test_compiled_prefill_attention_equals_each_query_decoded_alone(ops, heads, kv_heads, dim):
    """A prompt's attention takes a kv head's query heads together, eight positions at a time; a decode step takes
    one head. Each query's output must be the same bits either way (a prefix cached from one is reused by the
    other), and match softmax attention in float64. The shapes cover 16-lane and 8-lane chunks of a head, a head
    too narrow for either, groups of 1 to 5 heads, and lengths with and without a remainder of 8."""
    start, n, scale = 3, 21, dim ** -0.5
    capacity = start + n
    q = randn(n, heads, dim, seed=70 + dim)
    keys, values = randn(1, kv_heads, capacity, dim, seed=71 + dim), randn(1, kv_heads, capacity, dim, seed=72 + dim)
    together = ops.prefill_attention(q, keys, values, 0, start, scale)
    group = heads // kv_heads
    for t in range(n):
        length = start + t  # the decode step writes position `length` and attends over [0, length]
        alone = ops.decode_attention(q[t:t + 1].contiguous(), keys[:, :, length].contiguous(),
                                     values[:, :, length].contiguous(), keys.clone(), values.clone(),
                                     torch.tensor([length]), scale)
        assert torch.equal(together[t], alone[0]), t
        for h in range(heads):
            k, v = keys[0, h // group, :length + 1].double(), values[0, h // group, :length + 1].double()
            want = torch.softmax(k @ q[t, h].double() * scale, dim=0) @ v
            assert torch.allclose(together[t, h].double(), want, atol=1e-5), (t, h)


def test_compiled_prefill_attention_reads_queries_in_place_from_qkv(ops):
    """The prompt path hands prefill_attention the first heads of a chunk's qkv as they lie (no copy): the same
    bits as from a contiguous copy; a view whose heads are not contiguous is refused, not misread."""
    heads, kv, dim, start, n = 9, 3, 64, 2, 13
    qkv = randn(n, heads + 2 * kv, dim, seed=75)
    keys, values = randn(1, kv, start + n, dim, seed=76), randn(1, kv, start + n, dim, seed=77)
    in_place = ops.prefill_attention(qkv[:, :heads], keys, values, 0, start, dim ** -0.5)
    assert torch.equal(in_place, ops.prefill_attention(qkv[:, :heads].contiguous(), keys, values, 0, start,
                                                       dim ** -0.5))
    with pytest.raises(RuntimeError, match="contiguous heads"):
        ops.prefill_attention(qkv[:, :heads, ::2], keys, values, 0, start, dim ** -0.5)
    # Several prompts prefilled together: each writes its rows of the step's output.
    step = torch.full((n + 4, heads, dim), 7.0)
    kernels.prefill_attention(qkv[:, :heads], keys, values, 0, start, dim ** -0.5, out=step[2:2 + n])
    assert torch.equal(step[2:2 + n], in_place) and (step[:2] == 7).all() and (step[2 + n:] == 7).all()
    with pytest.raises(RuntimeError, match="q's shape"):
        ops.prefill_attention_into_(step[:n - 1], qkv[:, :heads], keys, values, 0, start, dim ** -0.5)


@pytest.mark.parametrize(("heads", "kv_heads"), [(9, 3), (4, 4), (8, 1)])
def test_compiled_store_kv_writes_a_chunks_keys_and_values_at_its_positions(ops, heads, kv_heads):
    dim, n, start, slots, capacity = 16, 7, 5, 3, 20
    qkv = randn(n, heads + 2 * kv_heads, dim, seed=78)
    keys, values = randn(slots, kv_heads, capacity, dim, seed=79), randn(slots, kv_heads, capacity, dim, seed=80)
    want_keys, want_values = keys.clone(), values.clone()
    want_keys[1, :, start:start + n] = qkv[:, heads:heads + kv_heads].transpose(0, 1)
    want_values[1, :, start:start + n] = qkv[:, heads + kv_heads:].transpose(0, 1)
    ops.store_kv_(qkv, keys, values, 1, start, heads)
    assert torch.equal(keys, want_keys) and torch.equal(values, want_values)  # other slots and positions untouched
    with pytest.raises(RuntimeError, match="past the cache"):
        ops.store_kv_(qkv, keys, values, 1, capacity - n + 1, heads)
    with pytest.raises(RuntimeError, match="do not match"):
        ops.store_kv_(qkv, keys, values, 1, start, heads + 1)


def test_compiled_store_kv_and_add_equal_the_reference(ops, monkeypatch):
    heads, kv, dim, n = 6, 2, 8, 5
    qkv = randn(n, heads + 2 * kv, dim, seed=81)
    caches = [torch.zeros(2, kv, 9, dim) for _ in range(4)]
    x, y = randn(70_000, seed=82), randn(70_000, seed=83)  # past one piece of the threads' split
    compiled_sum = x.clone()
    kernels.store_kv_(qkv, caches[0], caches[1], 1, 3, heads)
    kernels.add_(compiled_sum, y)
    with pytest.raises(RuntimeError, match="one shape"):
        ops.add_(x, y[:10])
    monkeypatch.setitem(kernels._state, "ok", False)
    kernels.store_kv_(qkv, caches[2], caches[3], 1, 3, heads)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    assert torch.equal(compiled_sum, x + y)
    keys, values = randn(1, kv, 9, dim, seed=84), randn(1, kv, 9, dim, seed=85)
    step = torch.zeros(n + 1, heads, dim)
    kernels.prefill_attention(qkv[:, :heads], keys, values, 0, 2, 0.3, out=step[1:])
    monkeypatch.setitem(kernels._state, "ok", True)
    torch.testing.assert_close(step[1:], kernels.prefill_attention(qkv[:, :heads], keys, values, 0, 2, 0.3),
                               rtol=1e-5, atol=1e-6)


# -- the torch reference path (no compiler) ----------------------------------------------------------------
@pytest.mark.parametrize("rows", [1, 5, 17])
def test_reference_linear_float(reference_path, rows):
    x = randn(rows, 70, seed=rows + 70)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        w = randn(37, 70, seed=rows + 71).to(dtype)
        torch.testing.assert_close(kernels.linear_float(x, w).double(), x.double() @ w.double().T,
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("rows", [1, 5, 17])
def test_reference_linear_quantized(reference_path, rows, fmt):
    x = randn(rows, 96, seed=rows + 96)
    x[0, :32] = 0  # a zero block
    w = randn(48, 96, seed=rows + 97)
    if fmt == "int8":
        weights, scale = kernels.pack_int8(w)
        dense, got = kernels.unpack_int8(weights, scale), kernels.linear_int8(x, weights, scale)
    else:
        weights, scale = kernels.pack_int4(w)
        dense, got = kernels.unpack_int4(weights, scale), kernels.linear_int4(x, weights, scale)
    assert got.shape == (rows, 48) and torch.isfinite(got).all()
    assert rel_err(got, quant_linear_exact(x, dense)) < 1e-5
    err = (got.double() - x.double() @ w.double().T).abs()
    assert torch.all(err <= quant_error_bound(x, w, dense) * (1 + 1e-4) + 1e-5)
    # The reference quantizes activations per block of 32 like the kernels (not a plain float product).
    assert not torch.allclose(got, x @ dense.T, rtol=1e-6, atol=1e-6)


def test_reference_quantize_activations(reference_path):
    x = randn(3, 64, seed=5, scale=2.0)
    x[1, 32:] = 0
    got = kernels.quantize_activations(x)
    q, scale = quantize_like_kernel(x)
    torch.testing.assert_close(got, q * expand_scales(scale), rtol=1e-6, atol=1e-7)
    step = expand_scales(scale)
    assert torch.all((got - x).abs() <= step / 2 + 1e-6)
    assert torch.all(got[1, 32:] == 0)


def test_reference_rms_norm(reference_path):
    x = randn(2, 3, 48, seed=71, scale=3.0)
    weight = rand(48, seed=72, low=0.5, high=1.5)
    torch.testing.assert_close(kernels.rms_norm(x, weight, 1e-5).double(), rms_norm_math(x, weight, 1e-5),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("tables", ["llama", "random"])
def test_reference_rope_rotates_only_the_first_heads(reference_path, tables):
    tokens, all_heads, heads, dim = 5, 6, 4, 16
    x = randn(tokens, all_heads, dim, seed=81)
    cos, sin = rope_tables(tokens, dim) if tables == "llama" else (randn(tokens, dim, seed=82),
                                                                            randn(tokens, dim, seed=83))
    before = x.clone()
    want = rope_math(x, cos, sin, heads)
    assert kernels.rope_(x, cos, sin, heads) is None
    torch.testing.assert_close(x[:, :heads].double(), want[:, :heads], rtol=1e-5, atol=1e-6)
    assert torch.equal(x[:, heads:], before[:, heads:])


def test_reference_rope_preserves_norms_and_is_identity_at_position_zero(reference_path):
    tokens, dim = 5, 16
    x = randn(tokens, 2, dim, seed=84)
    before = x.clone()
    cos, sin = rope_tables(tokens, dim)
    kernels.rope_(x, cos, sin, 2)
    torch.testing.assert_close(x.norm(dim=-1), before.norm(dim=-1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(x[3], before[3], rtol=0, atol=0)  # the table's row 3 is position 0


def test_reference_silu_mul(reference_path):
    gate_up = randn(5, 48, seed=91, scale=4.0)
    gate_up[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -20.0])
    got = kernels.silu_mul(gate_up)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), silu_mul_math(gate_up), rtol=1e-5, atol=1e-6)


def test_reference_decode_attention(reference_path):
    q, k, v, keys, values, lengths, scale = attention_case(seed=101)
    want_keys, want_values = expected_cache(keys, k, lengths), expected_cache(values, v, lengths)
    got = kernels.decode_attention(q, k, v, keys, values, lengths, scale)
    assert torch.equal(keys, want_keys)
    assert torch.equal(values, want_values)
    torch.testing.assert_close(got.double(), attention_math(q, want_keys, want_values, lengths, scale),
                               rtol=1e-5, atol=1e-6)
    assert math.isclose(scale, 8 ** -0.5)
