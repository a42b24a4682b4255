"""The decode kernels (csrc/), built into the package at install time, and their reference in plain torch.

`pip install` builds one library holding every instruction-set variant of the kernels (portable, AVX2,
AVX-512, AVX-512 VNNI; gym.infer.fast.kernel_build is the recipe, setup.py runs it), and the library picks the
best variant this CPU runs when it loads. No compiler is needed at run time. `GYM_KERNEL_ISA=avx2` (or
avx512, avx512_vnni, portable) forces a variant, so a machine with AVX-512 can run and test what an AVX2-only
machine runs; `use_isa` switches within a process.

Where the package has no prebuilt library for these sources (an install without torch at build time, or an
editable install whose csrc changed since), the same recipe is built once per machine into
`$GYM_HOME/kernels/<sources' digest>` if a compiler and ninja are there. Where neither works, `kernel_status()`
says why and every linear layer runs the torch reference below instead, which computes the same thing
(activations quantized per block for int8/int4, like the kernels): correct, slower.

Batch invariance: every operation here gives each row the numbers it gets alone, whatever other rows share
the call, on every path (the kernels' per-row arithmetic is fixed, see csrc/linear.cpp; the torch reference
computes row by row, because a BLAS product's rounding depends on the rows it multiplies together). So a
request's greedy answer never depends on the load.
"""

from __future__ import annotations

import importlib.machinery
import logging
import os
import shutil
import sys
import threading
from pathlib import Path

import torch

from gym.core.errors import ConfigError
from gym.core.home import gym_home
from gym.core.names import did_you_mean
from gym.infer.fast import kernel_build

logger = logging.getLogger(__name__)

BLOCK = 32  # weights per block of packed int8/int4 weights (one float16 scale each)
GROUP = 16  # output rows stored interleaved, so that a vector's lanes are 16 outputs (see csrc/linear.cpp)
QUAD = 4  # inputs per output side by side in the interleaved layout: what one 32-bit lane multiplies

_lock = threading.Lock()
_state: dict[str, str | bool] = {}

ISAS = ("auto", *kernel_build.VARIANTS)


def requested_isa() -> str:
    """The variant GYM_KERNEL_ISA asks for: auto (the best this CPU runs, the default) or a variant's name."""
    isa = os.environ.get("GYM_KERNEL_ISA", "auto").lower() or "auto"
    isa = "auto" if isa == "native" else isa  # the name of the per-machine build this replaced
    if isa not in ISAS:
        # a setting of the user's: one line and exit status 2 at the door, not a traceback
        raise ConfigError(f"GYM_KERNEL_ISA={isa!r}: choose one of {', '.join(ISAS)}.{did_you_mean(isa, ISAS)}")
    return isa


def kernel_isa() -> str | None:
    """The variant the loaded kernels run (avx512_vnni, avx512, avx2 or portable); None without kernels."""
    if kernel_status() is not None:
        return None
    return str(torch.ops.gym_kernels.isa())


def runnable_isas() -> list[str]:
    """The variants this CPU can run, best first (empty without kernels)."""
    if kernel_status() is not None:
        return []
    return [str(name) for name in torch.ops.gym_kernels.isas()]


def use_isa(name: str) -> str:
    """Switch the loaded kernels to variant `name` (or auto) for the whole process; the variant now used."""
    if kernel_status() is not None:
        raise RuntimeError(f"the kernels are not loaded: {kernel_status()}")
    return str(torch.ops.gym_kernels.use_isa(name))


def kernel_origin() -> str | None:
    """Where the loaded kernels came from: "prebuilt" (the installed package's) or "built here"; None."""
    kernel_status()
    return str(_state["origin"]) if _state.get("ok") else None


def kernel_status() -> str | None:
    """None when the kernels are loaded (building them here if no prebuilt library matches); else why not."""
    with _lock:
        if "ok" not in _state:
            _state.update(_load())
        return None if _state["ok"] else str(_state["reason"])


def prebuilt_library() -> Path | None:
    """The library `pip install` built into the package, if there is one."""
    folder = Path(__file__).parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        found = folder / f"_kernels{suffix}"
        if found.is_file():
            return found
    return None


def _load() -> dict[str, str | bool]:
    if os.environ.get("GYM_NO_KERNELS"):
        return {"ok": False, "reason": "GYM_NO_KERNELS is set"}
    isa = requested_isa()
    wanted = kernel_build.source_hash()
    prebuilt = prebuilt_library()
    if prebuilt is not None and kernel_build.built_hash(prebuilt) == wanted:
        torch.ops.load_library(str(prebuilt))
        return _chosen(isa, "prebuilt")
    why = ("the installed package has no prebuilt kernels" if prebuilt is None else
           f"the prebuilt kernels ({prebuilt.name}) are of other sources than this package's csrc")
    missing = _no_build_tools()
    if missing is not None:
        return {"ok": False, "reason": f"{why}, and {missing} to build them"}
    from torch.utils.cpp_extension import load

    folder = gym_home() / "kernels" / wanted
    folder.mkdir(parents=True, exist_ok=True)
    logger.info("Building the fast engine's kernels (%s), once per machine, into %s", why, folder)
    try:
        load(name="gym_kernels", sources=[str(p) for p in kernel_build.source_paths()],
             extra_cflags=[*kernel_build.COMPILE_FLAGS, kernel_build.hash_define(wanted)],
             build_directory=str(folder), is_python_module=False, verbose=False)
    except Exception as exc:  # a compiler error must not stop inference: the reference path still works
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        return {"ok": False, "reason": f"{why}, and they did not build here: {reason}"}
    return _chosen(isa, "built here")


def _chosen(isa: str, origin: str) -> dict[str, str | bool]:
    try:
        torch.ops.gym_kernels.use_isa(isa)
    except RuntimeError as exc:  # a variant this CPU cannot run: one line, the reference path still works
        return {"ok": False, "reason": str(exc).splitlines()[0]}
    return {"ok": True, "reason": "", "origin": origin}


def _no_build_tools() -> str | None:
    if not any(shutil.which(cc) for cc in ("c++", "g++", "clang++")):
        return "no C++ compiler (c++/g++/clang++) on PATH"
    # torch runs `ninja` from PATH; the ninja wheel puts it beside this interpreter, which may not be on PATH.
    beside = Path(sys.executable).parent
    if shutil.which("ninja") is None and (beside / "ninja").is_file():
        os.environ["PATH"] = f"{beside}{os.pathsep}{os.environ.get('PATH', '')}"
    if shutil.which("ninja") is None:
        return "ninja is not installed (pip install ninja)"
    return None


# -- packing ---------------------------------------------------------------------------------------------
def _grouped(codes: torch.Tensor) -> torch.Tensor:
    """Codes [N, K] row-major -> [N/16][K/32][8 quads][16 rows][4 inputs], the kernels' int8 layout."""
    n, k = codes.shape
    view = codes.view(n // GROUP, GROUP, k // BLOCK, BLOCK // QUAD, QUAD)
    return view.permute(0, 2, 3, 1, 4).contiguous().view(n, k)


def _ungrouped(grouped: torch.Tensor) -> torch.Tensor:
    n, k = grouped.shape
    view = grouped.view(n // GROUP, k // BLOCK, BLOCK // QUAD, GROUP, QUAD)
    return view.permute(0, 3, 1, 2, 4).contiguous().view(n, k)


def _grouped_params(values: list[torch.Tensor]) -> torch.Tensor:
    """Per-block parameters [N, blocks] each -> [N/16][blocks][len(values)][16] float16, as [N, blocks * len]."""
    n, blocks = values[0].shape
    stacked = torch.stack([v.reshape(n // GROUP, GROUP, blocks).transpose(1, 2) for v in values], dim=2)
    return stacked.half().contiguous().view(n, blocks * len(values))


def _ungrouped_params(params: torch.Tensor, count: int) -> list[torch.Tensor]:
    n = params.shape[0]
    blocks = params.shape[1] // count
    view = params.view(n // GROUP, blocks, count, GROUP).float()
    return [view[:, :, i].transpose(1, 2).reshape(n, blocks) for i in range(count)]


def packable(weight: torch.Tensor) -> bool:
    return weight.dim() == 2 and weight.shape[1] % BLOCK == 0 and weight.shape[0] % GROUP == 0


# The scales _best_scales tries, as multiples of the block's largest magnitude / 127.
SCALE_FACTORS = torch.linspace(1.0, 0.7, 16)


def _halving_sum(x: torch.Tensor) -> torch.Tensor:
    """The sum over the last dimension (a power of two) in one fixed order: halves added element by element until
    one is left. A sum of two floats rounds the same in any order, so this is the same on every CPU and in the
    compiled packer (csrc/pack.cpp), where torch's sum adds in an order that depends on the vector width."""
    while x.shape[-1] > 1:
        half = x.shape[-1] // 2
        x = x[..., :half] + x[..., half:]
    return x[..., 0]


def _best_scales(blocks: torch.Tensor, base: torch.Tensor, low: int, high: int) -> torch.Tensor:
    """Per block, the scale among base * (1, 0.98, ..., 0.7) that rounds the block with the least squared
    error: clipping the largest weight a little often buys finer steps for all the others."""
    best, best_error = base, torch.full_like(base, float("inf"))
    for factor in SCALE_FACTORS.tolist():
        scale = (base * factor).half().float()
        inverse = torch.where(scale != 0, 1 / scale, torch.zeros_like(scale))
        q = torch.round(blocks * inverse[..., None]).clamp(low, high)
        error = _halving_sum((q * scale[..., None] - blocks) ** 2)
        better = error < best_error
        best, best_error = torch.where(better, scale, best), torch.where(better, error, best_error)
    return best


def pack_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per block of 32 -> (int8 [N, K], float16 scales [N, K/32]), in the kernels' group layout."""
    n, k = weight.shape
    if _state.get("ok"):  # the same numbers, ~30x faster (csrc/pack.cpp)
        q, scale = torch.ops.gym_kernels.pack_q8(weight.detach().float().contiguous(), SCALE_FACTORS)
        return _grouped(q), _grouped_params([scale])
    blocks = weight.detach().float().reshape(n, k // BLOCK, BLOCK)
    scale = _best_scales(blocks, blocks.abs().amax(-1) / 127, -127, 127)
    inverse = torch.where(scale != 0, 1 / scale, torch.zeros_like(scale))
    q = torch.round(blocks * inverse[..., None]).clamp(-127, 127).to(torch.int8).view(n, k)
    return _grouped(q), _grouped_params([scale])


def pack_int4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric int4 per block of 32, w ~ d * q + m with q in 0..15 (llama.cpp's Q4_1 grid) ->
    (uint8 [N, K/2] two per byte, float16 [N, K/16]) in the kernels' group layout: per group of 16 rows and
    block, the int8 layout's eight quads with quad c + 4 in the high nibbles of quad c; the parameters are
    each group's 16 steps d, then its 16 minimums m, block by block.

    The block's own minimum and maximum start the fit; a few least-squares refits of (d, m) to the
    codes then lower the error (~30% less squared error than a symmetric scale on Gaussian weights).
    Weights already on such a grid (a model from a Q4_1 GGUF, like the embedded one) come back exact."""
    n, k = weight.shape
    if _state.get("ok"):  # the same numbers, ~30x faster (csrc/pack.cpp)
        codes, step, low = torch.ops.gym_kernels.pack_q4(weight.detach().float().contiguous())
        return _nibbles(codes), _grouped_params([step, low])
    blocks = weight.detach().float().reshape(n, k // BLOCK, BLOCK)
    step = ((blocks.amax(-1) - blocks.amin(-1)) / 15).half().float()
    low = blocks.amin(-1).half().float()
    codes, error = _int4_codes(blocks, step, low)
    sum_b, count = _halving_sum(blocks), float(BLOCK)
    for _ in range(4):
        sum_q, sum_qq, sum_qb = _halving_sum(codes), _halving_sum(codes * codes), _halving_sum(codes * blocks)
        det = count * sum_qq - sum_q * sum_q
        solvable = det > 0
        fit_step = torch.where(solvable, (count * sum_qb - sum_q * sum_b) / torch.where(solvable, det, 1.0), step)
        fit_step = fit_step.half().float()
        fit_low = torch.where(solvable, (sum_b - fit_step * sum_q) / count, low).half().float()
        fit_codes, fit_error = _int4_codes(blocks, fit_step, fit_low)
        better = fit_error < error
        step, low = torch.where(better, fit_step, step), torch.where(better, fit_low, low)
        codes, error = torch.where(better[..., None], fit_codes, codes), torch.where(better, fit_error, error)
    return _nibbles(codes.to(torch.uint8).view(n, k)), _grouped_params([step, low])


def _nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Codes 0..15 [N, K] uint8 -> [N, K/2] two per byte in the int4 group layout (see pack_int4)."""
    n, k = codes.shape
    grouped = _grouped(codes).view(n // GROUP, k // BLOCK, 2, BLOCK // 2 * GROUP)
    packed = grouped[:, :, 0] | (grouped[:, :, 1] << 4)
    return packed.contiguous().view(n, k // 2)


def _int4_codes(blocks: torch.Tensor, step: torch.Tensor, low: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The nearest codes 0..15 of each block for (step, low), and each block's squared error."""
    inverse = torch.where(step != 0, 1 / step, torch.zeros_like(step))
    codes = torch.round((blocks - low[..., None]) * inverse[..., None]).clamp(0, 15)
    error = _halving_sum((codes * step[..., None] + low[..., None] - blocks) ** 2)
    return codes, error


def unpack_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    n, k = q.shape
    (scales,) = _ungrouped_params(scale, 1)
    return (_ungrouped(q).view(n, k // BLOCK, BLOCK).float() * scales[..., None]).view(n, k)


def unpack_int4(packed: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    n, half = packed.shape
    k = half * 2
    step, low = _ungrouped_params(params, 2)
    nibbles = packed.view(n // GROUP, k // BLOCK, 1, BLOCK // 2 * GROUP)
    codes = torch.cat([nibbles & 0x0F, nibbles >> 4], dim=2).view(n, k)
    rows = _ungrouped(codes).view(n, k // BLOCK, BLOCK).float()
    return (rows * step[..., None] + low[..., None]).view(n, k)


def quantize_activations(x: torch.Tensor) -> torch.Tensor:
    """What the integer kernels do to the activations: int8 per block of 32, returned dequantized."""
    b, k = x.shape
    blocks = x.view(b, k // BLOCK, BLOCK)
    scale = blocks.abs().amax(-1, keepdim=True) / 127
    q = torch.round(blocks / torch.where(scale > 0, scale, torch.ones_like(scale)))
    return (q * scale).view(b, k)


# -- the operations --------------------------------------------------------------------------------------
def _rowwise(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.T one row at a time: a matrix-vector product per row, so no row's rounding depends on the
    others (the torch reference's batch invariance)."""
    weight_t = weight.T
    return torch.stack([row @ weight_t for row in x]) if x.shape[0] else x.new_zeros(0, weight.shape[0])


def linear_float(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [B, K] float32 @ weight [N, K] (float32, bfloat16 or float16) -> [B, N] float32."""
    if _state.get("ok"):
        out: torch.Tensor = torch.ops.gym_kernels.linear(x.contiguous(), weight.contiguous())
        return out
    return _rowwise(x, weight.float())


def linear_int8(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    if _state.get("ok"):
        out: torch.Tensor = torch.ops.gym_kernels.linear_q8(x, q, scale)
        return out
    return _rowwise(quantize_activations(x), unpack_int8(q, scale))


def linear_int4(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    if _state.get("ok"):
        out: torch.Tensor = torch.ops.gym_kernels.linear_q4(x, packed, scale)
        return out
    return _rowwise(quantize_activations(x), unpack_int4(packed, scale))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if _state.get("ok"):
        out: torch.Tensor = torch.ops.gym_kernels.rms_norm(x.contiguous(), weight, eps)
        return out
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)


def rope_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int) -> None:
    """Rotate the first `heads` heads of x [tokens, heads, dim] in place; cos/sin are [tokens, dim]."""
    if _state.get("ok"):
        torch.ops.gym_kernels.rope_(x, cos, sin, heads)
        return
    part = x[:, :heads]
    half = x.shape[-1] // 2
    rotated = torch.cat([-part[..., half:], part[..., :half]], dim=-1)
    part.copy_(part * cos[:, None] + rotated * sin[:, None])


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                     lengths: torch.Tensor, scale: float) -> torch.Tensor:
    """Store row r's new k/v at position lengths[r] of cache slot r, then attend over [0, lengths[r]].
    q [rows, heads, dim], k/v [rows, kv heads, dim], keys/values [slots, kv heads, capacity, dim]."""
    if _state.get("ok"):
        out: torch.Tensor = torch.ops.gym_kernels.decode_attention(q, k, v, keys, values, lengths, scale)
        return out
    rows = q.shape[0]
    slots = torch.arange(rows)
    keys[slots, :, lengths] = k
    values[slots, :, lengths] = v
    out = torch.empty_like(q)
    for row, length in enumerate(lengths.tolist()):  # each row over its own length: no padding to the longest
        out[row] = _attend(q[row], keys[row, :, :length + 1], values[row, :, :length + 1], scale)
    return out


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    """One query position's heads q [heads, dim] over keys/values [kv heads, n, dim] -> [heads, dim]."""
    group = q.shape[0] // keys.shape[0]
    keys, values = keys.repeat_interleave(group, 0), values.repeat_interleave(group, 0)
    weights = torch.softmax((keys @ q[:, :, None])[:, :, 0] * scale, dim=-1)
    return (weights[:, None, :] @ values)[:, 0]


def store_kv_(qkv: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, slot: int, start: int, heads: int) -> None:
    """A prompt chunk's keys and values (heads [heads, heads + kv) and the kv after them of qkv [n, heads + 2 kv,
    dim]) into positions [start, start + n) of cache slot `slot` (keys/values [slots, kv, capacity, dim])."""
    if _state.get("ok"):
        torch.ops.gym_kernels.store_kv_(qkv, keys, values, slot, start, heads)
        return
    kv = keys.shape[1]
    keys[slot, :, start:start + qkv.shape[0]] = qkv[:, heads:heads + kv].transpose(0, 1)
    values[slot, :, start:start + qkv.shape[0]] = qkv[:, heads + kv:].transpose(0, 1)


def add_(x: torch.Tensor, y: torch.Tensor) -> None:
    """x += y. On the engine's threads, not torch's: see prefill_many (gym.infer.fast.cpu)."""
    if _state.get("ok"):
        torch.ops.gym_kernels.add_(x, y)
        return
    x.add_(y)


def prefill_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, slot: int, start: int,
                      scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """A prompt's attention in cache slot `slot`, which holds positions [0, start + n) already: query i of
    q [n, heads, dim] attends over [0, start + i], each exactly as a decode step attends (batch invariance:
    a position's numbers do not depend on the chunk it was prefilled in). q may be a view of a chunk's qkv
    (its first heads), read in place; `out` (contiguous, q's shape) receives the result where given."""
    if _state.get("ok"):
        if q.stride(-1) != 1 or q.stride(1) != q.shape[-1]:
            q = q.contiguous()
        if out is None:
            result: torch.Tensor = torch.ops.gym_kernels.prefill_attention(q, keys, values, slot, start, scale)
            return result
        torch.ops.gym_kernels.prefill_attention_into_(out, q, keys, values, slot, start, scale)
        return out
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    for i in range(q.shape[0]):
        out[i] = _attend(q[i], keys[slot, :, :start + i + 1], values[slot, :, :start + i + 1], scale)
    return out


def decode_layers(x: torch.Tensor, tensors: list[torch.Tensor], formats: list[int], cos: torch.Tensor,
                  sin: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], lengths: torch.Tensor,
                  heads: int, kv_heads: int, dim: int, eps: float, scale: float) -> torch.Tensor:
    """Every layer of a decode step in one call (FastDecoder.step_tensors says what `tensors` and `formats`
    hold); the compiled kernels only: without them the decoder walks its layers itself."""
    out: torch.Tensor = torch.ops.gym_kernels.decode_layers(x, tensors, formats, cos, sin, keys, values, lengths,
                                                            heads, kv_heads, dim, eps, scale)
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    if _state.get("ok"):
        out: torch.Tensor = torch.ops.gym_kernels.silu_mul(gate_up)
        return out
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def unpack_signs(bits: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """Packed sign bits (row-major [out, in], lowest bit first, 1 = +1) -> float32 ±1 [out, in]."""
    shifts = torch.arange(8, dtype=torch.uint8, device=bits.device)
    flat = (bits.reshape(-1, 1) >> shifts) & 1
    return flat.reshape(-1)[:out_features * in_features].view(out_features, in_features).float() * 2 - 1


def expand_groups(scales: torch.Tensor, group_size: int, in_features: int) -> torch.Tensor:
    """A [out, groups] scale grid spread over [out, in] (the last group may be shorter)."""
    return scales.repeat_interleave(group_size, dim=1)[:, :in_features]


SIGN_TILE = 32  # outputs per tile of the packed kernel's sign layout


def tile_signs(bits: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """Row-major packed signs (unpack_signs' layout, in_features a multiple of 8) -> the packed kernel's layout:
    tiles of 32 outputs, each [in/8, 32] (byte j of output n at tile n // 32, row j, column n % 32), the outputs
    past the last zero. One load then brings 32 outputs' signs for eight inputs."""
    if in_features % 8:
        raise ValueError(f"tiled signs need a multiple of 8 inputs, got {in_features}")
    per_row = in_features // 8
    rows = bits.reshape(-1)[:out_features * per_row].view(out_features, per_row)
    padded = -(-out_features // SIGN_TILE) * SIGN_TILE
    if padded != out_features:
        rows = torch.cat([rows, rows.new_zeros(padded - out_features, per_row)])
    return rows.view(-1, SIGN_TILE, per_row).transpose(1, 2).contiguous().view(-1)


def untile_signs(tiled: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """tile_signs undone: the row-major packed signs."""
    per_row = in_features // 8
    rows = tiled.reshape(-1, per_row, SIGN_TILE).transpose(1, 2).reshape(-1, per_row)
    return rows[:out_features].contiguous().view(-1)


def sign_matmul_add_(y: torch.Tensor, x: torch.Tensor, rows: torch.Tensor, bits: list[torch.Tensor],
                     scales: list[torch.Tensor], group_sizes: list[int]) -> None:
    """y[rows[e]] += (scales[e] spread over groups * signs[e]) applied to x[rows[e]], for each entry e: a 1-bit
    delta's correction on the rows that use it. bits[e] holds [out, in] signs as tile_signs lays them out (in
    a multiple of 8); scales[e] is float32 [out, groups] with groups of group_sizes[e] inputs. Entries sharing
    one sign matrix should come together."""
    if _state.get("ok") and all(g % 8 == 0 or g >= x.shape[1] for g in group_sizes):
        torch.ops.gym_kernels.sign_matmul_add_(y, x, rows, bits, scales, group_sizes)
        return
    out_features, in_features = y.shape[1], x.shape[1]
    for e, row in enumerate(rows.tolist()):
        signs = unpack_signs(untile_signs(bits[e], out_features, in_features), out_features, in_features)
        matrix = signs * expand_groups(scales[e], group_sizes[e], in_features)
        y[row] += x[row] @ matrix.T


def nucleus_pick(probs: torch.Tensor, top_p: list[float], draws: list[float], cut: float,
                 limit: int) -> list[int] | None:
    """Each row's top-p pick as gym.infer.sampling._nucleus_pick makes it (-1 where that gives None), in the compiled
    kernels, on the calling thread (csrc/sampling.cpp says why); None where the kernels are not loaded. It never loads
    them: every engine samples, and a transformers engine must not build the fast engine's kernels to do so."""
    if not _state.get("ok"):
        return None
    picks: torch.Tensor = torch.ops.gym_kernels.nucleus_pick(probs.contiguous(), top_p, draws, cut, limit)
    out: list[int] = picks.tolist()
    return out


def softmax_rows(logits: torch.Tensor, temperatures: list[float]) -> torch.Tensor:
    """softmax(logits[r] / temperatures[r]) of each row of a CPU float32 [rows, vocab]: in the compiled kernels where
    they are loaded (never loading them, as nucleus_pick), else torch's; each row computed alone either way."""
    if _state.get("ok"):
        out: torch.Tensor = torch.ops.gym_kernels.softmax_rows(logits.contiguous(), temperatures)
        return out
    return torch.softmax(logits / torch.tensor(temperatures)[:, None], -1)
