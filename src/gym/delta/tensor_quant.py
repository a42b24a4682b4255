"""Tensor quantizers for one fine-tune delta tensor (int8/int4/int2, ternary, binary), used by DeltaQuant.

A delta (fine-tuned minus base weight) is quantized per *unit*, and every unit gets its own scale:

- ``"tensor"``: the whole tensor is one unit;
- ``"channel"``: each output channel (slice along dim 0) is a unit; 0-D and 1-D tensors are one channel;
- ``"group"``: each row (all dims but the last flattened) is cut into consecutive groups of ``group_size``
  elements along the last dim; the last group of a row may be shorter (it is never padded).

Per-unit tensors (``scale``, ``zero``) are stored with a 2-D "unit grid" shape: (1, 1) per tensor,
(channels, 1) per channel, (rows, ceil(last_dim / group_size)) per group.

Statistics are computed in float32 and stored in float16, and every code is computed against the *stored*
float16 value, so `dequantize` reproduces the same tensor from the file bit for bit. Integer scales are
rounded *up* to the next float16 (and asymmetric zeros *down*) so a unit's range always fits in its code
range: without that, a scale that rounds down, or underflows on a tiny delta, would clamp the largest
entries. Rounding of x / scale is half-to-even (`torch.round`).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch

from gym.core.errors import ConfigError
from gym.core.names import enum_choice
from gym.delta.bitpack import pack, unpack

GRANULARITIES = ("tensor", "channel", "group")
TERNARY_THRESHOLD = 0.7  # Li & Liu 2016: t = 0.7 * mean|x| approximates the optimal ternary threshold.


class QuantMethod(str, enum.Enum):
    """How each delta entry is coded; `BITS` gives the bits per entry."""

    INT8 = "int8"
    INT4 = "int4"
    INT2 = "int2"
    TERNARY = "ternary"
    BINARY = "binary"


BITS: dict[QuantMethod, int] = {
    QuantMethod.INT8: 8,
    QuantMethod.INT4: 4,
    QuantMethod.INT2: 2,
    QuantMethod.TERNARY: 2,  # three levels stored in two bits
    QuantMethod.BINARY: 1,
}
_SIGN_METHODS = (QuantMethod.TERNARY, QuantMethod.BINARY)
_Quantized = tuple[torch.Tensor, dict[str, torch.Tensor]]  # a block's uint8 codes, its per-unit float16 stats
_Kernel = Callable[[torch.Tensor], _Quantized]


@dataclass
class Encoded:
    """One quantized tensor: what goes into the delta file.

    tensors: "codes" (packed uint8), "scale" (float16 unit grid) and, for asymmetric int, "zero" (float16).
    params: JSON-able {"granularity", "group_size", "symmetric", "clip_percentile"}.
    """

    method: QuantMethod
    shape: tuple[int, ...]
    tensors: dict[str, torch.Tensor]
    params: dict[str, Any]


def _parse_method(method: QuantMethod | str) -> QuantMethod:
    return enum_choice(QuantMethod, method, "delta compression method")


def _check_options(
    method: QuantMethod, granularity: str, group_size: int | None, symmetric: bool, clip_percentile: float | None
) -> None:
    if granularity not in GRANULARITIES:
        raise ConfigError(f"Unknown granularity {granularity!r}; choose one of: {', '.join(GRANULARITIES)}.")
    if granularity == "group" and (isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1):
        raise ConfigError(f"granularity 'group' needs an integer group_size >= 1 (e.g. 128), got {group_size!r}.")
    if method in _SIGN_METHODS and (not symmetric or clip_percentile is not None):
        raise ConfigError(
            f"{method.value} has no symmetric/clip_percentile options; "
            "leave symmetric true and clip_percentile unset, or use int8/int4/int2."
        )
    if clip_percentile is not None and (
        isinstance(clip_percentile, bool)
        or not isinstance(clip_percentile, (int, float))
        or not 50.0 < clip_percentile <= 100.0
    ):
        raise ConfigError(f"clip_percentile must be in (50, 100], e.g. 99.9; got {clip_percentile!r}.")


def _check_input(x: torch.Tensor) -> torch.Tensor:
    if not x.is_floating_point():
        raise ConfigError(f"Can only quantize floating-point tensors, got {x.dtype}.")
    if x.numel() == 0:
        raise ConfigError(f"Cannot quantize an empty tensor (shape {tuple(x.shape)}); skip it instead.")
    x32 = x.detach().to(torch.float32)
    # The sum is non-finite whenever an entry is, and is far cheaper than a full isfinite pass; only an
    # overflowing sum of huge finite values needs the exact check.
    if not torch.isfinite(x32.sum()) and not torch.isfinite(x32).all():
        raise ConfigError("The tensor to quantize contains NaN or Inf; check the base and fine-tuned weights.")
    return x32


def _view_shape(shape: tuple[int, ...], granularity: str) -> tuple[int, int]:
    """The (rows, cols) matrix the units are cut from."""
    numel = math.prod(shape)
    if granularity == "tensor" or len(shape) == 0:
        return 1, numel
    if granularity == "channel":
        return (shape[0], numel // shape[0]) if len(shape) >= 2 else (1, numel)
    return numel // shape[-1], shape[-1]


def _blocks(t2: torch.Tensor, granularity: str, group_size: int | None) -> list[torch.Tensor]:
    """Cut the (rows, cols) view into blocks whose rows are units.

    Groups come in at most two equal-length blocks (full groups, then each row's shorter tail), so no unit
    is ever padded and every statistic sees only real elements.
    """
    if granularity == "tensor":
        return [t2.reshape(1, -1)]
    if granularity == "channel":
        return [t2]
    if group_size is None:
        raise ValueError("granularity 'group' needs a group_size")
    full = t2.shape[1] // group_size * group_size
    blocks = [t2[:, :full].reshape(-1, group_size)] if full else []
    if full < t2.shape[1]:
        blocks.append(t2[:, full:])
    return blocks


def _grid_blocks(grid: torch.Tensor, cols: int, granularity: str, group_size: int | None) -> list[torch.Tensor]:
    """Split a stored unit grid the way `_blocks` splits the elements: one (units,) vector per block."""
    if granularity != "group":
        return [grid.reshape(-1)]
    if group_size is None:
        raise ValueError("granularity 'group' needs a group_size")
    n_full = cols // group_size
    parts = [grid[:, :n_full]] if n_full else []
    if n_full * group_size < cols:
        parts.append(grid[:, n_full:])
    return [part.reshape(-1) for part in parts]


def _join(blocks: list[torch.Tensor], grid_rows: int) -> torch.Tensor:
    """Inverse of `_blocks` for element blocks, and the unit grid for per-unit (units,) vectors."""
    if len(blocks) == 1:
        return blocks[0].reshape(grid_rows, -1)
    return torch.cat([b.reshape(grid_rows, -1) for b in blocks], dim=1)


def _percentile(v: torch.Tensor, p: float) -> torch.Tensor:
    """Per-row p-th percentile with linear interpolation (numpy's default). kthvalue, unlike
    torch.quantile, has no input-size limit, and per-tensor units can hold tens of millions of entries."""
    n = v.shape[1]
    pos = p / 100.0 * (n - 1)
    k = math.floor(pos)
    lower = v.kthvalue(k + 1, dim=1).values
    frac = pos - k
    if frac == 0.0:
        return lower
    upper = v.kthvalue(min(k + 2, n), dim=1).values
    return lower + frac * (upper - lower)


def _fp16_round(v: torch.Tensor, direction: int = 0) -> torch.Tensor:
    """Round float32 `v` to float16: to nearest (direction 0), towards +inf (> 0) or towards -inf (< 0)."""
    h = v.to(torch.float16)
    if direction:
        off = h.to(torch.float32) < v if direction > 0 else h.to(torch.float32) > v
        towards = torch.full_like(h, math.copysign(math.inf, direction))
        h = torch.where(off, torch.nextafter(h, towards), h)
    if not torch.isfinite(h).all():
        raise ConfigError("Tensor values are too large for float16 scales and zeros (max ~65504); rescale the tensor.")
    return h


def _col(stat: torch.Tensor) -> torch.Tensor:
    """A per-unit vector as a float32 column, to broadcast over a block."""
    return stat.to(torch.float32).unsqueeze(1)


def _safe(scale: torch.Tensor) -> torch.Tensor:
    # A zero scale means the unit is all zeros (or constant): its codes are arbitrary, so divide by 1.
    s = _col(scale)
    return torch.where(s > 0, s, torch.ones_like(s))


def _kernel(method: QuantMethod, symmetric: bool, clip: float | None) -> _Kernel:
    """The function quantizing one block: (units, length) float32 -> (uint8 codes, float16 per-unit stats)."""
    if method is QuantMethod.BINARY:
        return lambda b: ((b >= 0).to(torch.uint8), {"scale": _fp16_round(b.abs().mean(dim=1))})
    if method is QuantMethod.TERNARY:
        return _ternary
    bits = BITS[method]
    if not symmetric:
        return lambda b: _asymmetric(b, 2**bits - 1, clip)
    return lambda b: _symmetric(b, 2 ** (bits - 1) - 1, clip)


def _symmetric(b: torch.Tensor, qmax: int, clip: float | None) -> _Quantized:
    if clip is None:
        lo, hi = torch.aminmax(b, dim=1)
        r = torch.maximum(-lo, hi)
    else:
        r = _percentile(b.abs(), clip)
    scale = _fp16_round(r / qmax, +1)
    q = (b / _safe(scale)).round_().clamp_(-qmax, qmax).add_(qmax)
    return q.to(torch.uint8), {"scale": scale}


def _asymmetric(b: torch.Tensor, levels: int, clip: float | None) -> _Quantized:
    if clip is None:
        lo, hi = torch.aminmax(b, dim=1)
    else:
        lo, hi = _percentile(b, 100.0 - clip), _percentile(b, clip)
    zero = _fp16_round(lo, -1)
    scale = _fp16_round((hi - zero.to(torch.float32)) / levels, +1)
    q = (b - _col(zero)).div_(_safe(scale)).round_().clamp_(0, levels)
    return q.to(torch.uint8), {"scale": scale, "zero": zero}


def _ternary(b: torch.Tensor) -> _Quantized:
    a = b.abs()
    kept = a > TERNARY_THRESHOLD * a.mean(dim=1, keepdim=True)
    alpha = (a * kept).sum(dim=1) / kept.sum(dim=1).clamp(min=1)
    codes = torch.where(kept, (b > 0).to(torch.uint8) * 2, torch.ones((), dtype=torch.uint8))
    return codes, {"scale": _fp16_round(alpha)}


def quantize(
    x: torch.Tensor,
    method: QuantMethod | str,
    *,
    granularity: str = "channel",
    group_size: int | None = None,
    symmetric: bool = True,
    clip_percentile: float | None = None,
) -> Encoded:
    """Quantize a floating-point delta (any float dtype, computed in float32) per unit.

    int8/int4/int2, symmetric: scale = r / qmax, qmax = 2**(b-1) - 1, r = max|x| of the unit (or the
    clip_percentile-th percentile of |x|; entries beyond r clamp); code = clamp(round(x/scale), ±qmax) + qmax.
    Asymmetric: zero = min, scale = (max - min) / (2**b - 1) (clip_percentile clips both tails at
    100-p and p); code = clamp(round((x - zero)/scale), 0, 2**b - 1); x̂ = zero + code*scale.
    ternary (TWN): t = 0.7 mean|x|; |x| <= t -> 0, else ±alpha, alpha = mean|x| over |x| > t (0 if none);
    codes 0/1/2 = -1/0/+1.
    binary (BitDelta): alpha = mean|x| (the L2-optimal scale for fixed signs); code 1 = +, 0 = -, and
    sign(0) = +1, so a zero entry comes back as +alpha (an all-zero unit has alpha 0 and comes back exact).
    group_size only matters for granularity "group"; with another granularity it is ignored (params record
    None), because one config's group_size is passed for every tensor, per-channel embeddings included.
    An all-zero unit always reconstructs as zeros; a constant unit exactly under asymmetric int (when the
    constant is float16-representable).
    """
    method = _parse_method(method)
    _check_options(method, granularity, group_size, symmetric, clip_percentile)
    x32 = _check_input(x)
    shape = tuple(x.shape)
    group_size = group_size if granularity == "group" else None
    rows, cols = _view_shape(shape, granularity)
    grid_rows = 1 if granularity == "tensor" else rows
    clip = None if clip_percentile is None else float(clip_percentile)
    kernel = _kernel(method, symmetric, clip)
    results = [kernel(b) for b in _blocks(x32.reshape(rows, cols), granularity, group_size)]
    tensors = {k: _join([stats[k] for _, stats in results], grid_rows) for k in results[0][1]}
    tensors["codes"] = pack(_join([codes for codes, _ in results], grid_rows), BITS[method])
    params: dict[str, Any] = {"granularity": granularity, "group_size": group_size, "symmetric": bool(symmetric)}
    params["clip_percentile"] = clip
    return Encoded(method=method, shape=shape, tensors=tensors, params=params)


def _codes(enc: Encoded) -> torch.Tensor:
    """The unpacked codes as float32 on the (rows, cols) view."""
    method = QuantMethod(enc.method)
    rows, cols = _view_shape(tuple(enc.shape), enc.params["granularity"])
    return unpack(enc.tensors["codes"], BITS[method], rows * cols).reshape(rows, cols).to(torch.float32)


def _reconstruct(
    method: QuantMethod, symmetric: bool, codes: torch.Tensor, stats: dict[str, torch.Tensor]
) -> torch.Tensor:
    """One block back to float32 (in place on `codes`, a fresh float32 tensor)."""
    scale = _col(stats["scale"])
    if method is QuantMethod.BINARY:
        return codes.mul_(2).sub_(1).mul_(scale)
    if method is QuantMethod.TERNARY:
        return codes.sub_(1).mul_(scale)
    if symmetric:
        return codes.sub_(2 ** (BITS[method] - 1) - 1).mul_(scale)
    return codes.mul_(scale).add_(_col(stats["zero"]))


def dequantize(enc: Encoded, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Reconstruct the tensor from its encoding (maths in float32 from the stored float16 stats)."""
    method = QuantMethod(enc.method)
    granularity, group_size = enc.params["granularity"], enc.params["group_size"]
    codes = _codes(enc)
    rows, cols = codes.shape
    stat_blocks = {k: _grid_blocks(v, cols, granularity, group_size) for k, v in enc.tensors.items() if k != "codes"}
    out = [
        _reconstruct(method, enc.params["symmetric"], block, {k: v[i] for k, v in stat_blocks.items()})
        for i, block in enumerate(_blocks(codes, granularity, group_size))
    ]
    return _join(out, 1 if granularity == "tensor" else rows).reshape(enc.shape).to(dtype)


def expand_scale(scale: torch.Tensor, enc: Encoded) -> torch.Tensor:
    """Spread a unit grid shaped like enc.tensors["scale"] over the elements: a tensor of shape enc.shape.

    Differentiable in `scale`, so alpha can be trained with the signs frozen: for a binary encoding,
    expand_scale(enc.tensors["scale"], enc) * signs(enc) equals dequantize(enc).
    """
    granularity = enc.params["granularity"]
    rows, cols = _view_shape(tuple(enc.shape), granularity)
    if granularity == "group":
        spread = scale.repeat_interleave(enc.params["group_size"], dim=1)[:, :cols]
    else:
        spread = scale.reshape(-1, 1).expand(rows, cols)  # (1, 1) per tensor or (rows, 1) per channel
    return spread.reshape(enc.shape)


def signs(enc: Encoded) -> torch.Tensor:
    """The ±1 float32 sign tensor (shape enc.shape) of a BINARY encoding, for training alpha with signs frozen."""
    if QuantMethod(enc.method) is not QuantMethod.BINARY:
        raise ValueError(f"signs() needs a binary encoding, got {enc.method}")
    return (2 * _codes(enc) - 1).reshape(enc.shape)


def relative_error(x: torch.Tensor, enc: Encoded) -> float:
    """||dequantize(enc) - x|| / ||x|| (Frobenius); 0.0 when x is all zeros."""
    if tuple(x.shape) != tuple(enc.shape):
        raise ValueError(f"shape mismatch: tensor {tuple(x.shape)} vs encoding {tuple(enc.shape)}")
    x32 = x.detach().to(torch.float32)
    norm = torch.linalg.vector_norm(x32).item()
    if norm == 0.0:
        return 0.0
    return cast(float, torch.linalg.vector_norm(dequantize(enc) - x32).item() / norm)


def encoded_bytes(enc: Encoded) -> int:
    """Total bytes of the stored tensors (codes plus per-unit stats)."""
    return sum(t.numel() * t.element_size() for t in enc.tensors.values())
