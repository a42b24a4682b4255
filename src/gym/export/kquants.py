"""llama.cpp's K-quants (Q4_K, Q5_K, Q6_K) written in numpy, from the format's specification.

The `gguf` package reads these types but cannot write them, and the usual way to make them is to build
llama.cpp and run llama-quantize. Here every 256-value super-block is quantized as ggml's reference
quantizer does it without an importance matrix, vectorized over all blocks of a tensor:

- Q4_K / Q5_K: 8 sub-blocks of 32 values, each an affine code x ~ scale*q - min with q in 0..15 (0..31).
  Each sub-block's (scale, min) comes from a weighted least-squares search over a few candidate step
  sizes (weights |x| + rms of the block); the 8 scales and 8 mins are then coded in 6 bits against one
  fp16 super-scale each. Q5_K stores the fifth bit of every q in a separate 32-byte plane.
- Q6_K: 16 sub-blocks of 16 values, each a symmetric code with q in -32..31, whose scale (found by a
  search weighted by x^2) is coded as an int8 against one fp16 super-scale.

Byte layouts (little endian): Q4_K d, dmin (fp16), scales[12], qs[128] = 144 bytes; Q5_K d, dmin,
scales[12], qh[32], qs[128] = 176 bytes; Q6_K ql[128], qh[64], scales[16] (int8), d = 210 bytes. The
tests dequantize what we write with the `gguf` package's own K-quant readers.
"""

from __future__ import annotations

import numpy as np

QK_K = 256
_CHUNK_BLOCKS = 4096  # super-blocks quantized at once (bounds the search's temporaries to ~100 MB)


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def _affine_search(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, nstep: int) -> tuple[np.ndarray, np.ndarray]:
    """Per sub-block (last axis) the (scale, min >= 0) of x ~ scale*q - min, q in 0..nmax, that minimise the weighted
    squared error over the candidate steps (nmax + rmin + 0.1*i) / (max - min), i = 0..nstep."""
    lo = np.minimum(x.min(-1), 0.0)
    hi = x.max(-1)
    span = hi - lo
    flat = span <= 0
    span = np.where(flat, 1.0, span)
    sum_w, sum_x = w.sum(-1), (w * x).sum(-1)

    def fit(iscale: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        q = np.clip(np.rint(iscale[..., None] * (x - lo[..., None])), 0, nmax)
        sum_l, sum_l2, sum_xl = (w * q).sum(-1), (w * q * q).sum(-1), (w * q * x).sum(-1)
        det = sum_w * sum_l2 - sum_l * sum_l
        ok = det > 0
        safe = np.where(ok, det, 1.0)
        scale = (sum_w * sum_xl - sum_x * sum_l) / safe
        offset = (sum_l2 * sum_x - sum_l * sum_xl) / safe
        positive = offset > 0  # the code's zero must stay at or below the smallest value
        scale = np.where(positive, sum_xl / np.where(sum_l2 > 0, sum_l2, 1.0), scale)
        offset = np.where(positive, 0.0, offset)
        error = (w * (scale[..., None] * q + offset[..., None] - x) ** 2).sum(-1)
        return scale, offset, np.where(ok, error, np.inf)

    best_scale = span / nmax
    best_offset = lo
    q0 = np.clip(np.rint((x - lo[..., None]) * (nmax / span)[..., None]), 0, nmax)
    best_error = (w * (best_scale[..., None] * q0 + lo[..., None] - x) ** 2).sum(-1)
    for step in range(nstep + 1):
        scale, offset, error = fit((rmin + 0.1 * step + nmax) / span)
        better = error < best_error
        best_scale = np.where(better, scale, best_scale)
        best_offset = np.where(better, offset, best_offset)
        best_error = np.where(better, error, best_error)
    return np.where(flat, 0.0, best_scale), np.where(flat, -lo, -best_offset)


def _inverse(x: np.ndarray) -> np.ndarray:
    """1/x, and 0 where x is 0 (an all-zero block codes everything as 0)."""
    return np.where(x > 0, 1 / np.where(x > 0, x, 1), 0.0)


def _pack_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """8 six-bit scales and 8 six-bit mins per block (uint8 arrays (B, 8)) -> 12 bytes per block."""
    out = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    return out


def _affine_blocks(x: np.ndarray, nmax: int, rmin: float, nstep: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(d, dmin as fp16 bytes, packed scales, q (B, 256) in 0..nmax) for super-blocks x (B, 256)."""
    sub = x.reshape(-1, 8, 32)
    rms = np.sqrt((x * x).mean(-1))
    weights = rms[:, None, None] + np.abs(sub)
    scale, the_min = _affine_search(sub, weights, nmax, rmin, nstep)
    max_scale, max_min = scale.max(-1), the_min.max(-1)
    sc = np.minimum(63, np.rint(scale * _inverse(max_scale / 63)[:, None]))
    m = np.minimum(63, np.rint(the_min * _inverse(max_min / 63)[:, None]))
    d, dmin = (max_scale / 63).astype(np.float16), (max_min / 63).astype(np.float16)
    step = d.astype(np.float32)[:, None] * sc
    shift = dmin.astype(np.float32)[:, None] * m
    q = np.clip(np.rint((sub + shift[..., None]) / np.where(step > 0, step, 1)[..., None]), 0, nmax)
    q = np.where((step > 0)[..., None], q, 0).astype(np.uint8).reshape(-1, QK_K)
    return d, dmin, _pack_scales(sc.astype(np.uint8), m.astype(np.uint8)), q


def _low_nibbles(q: np.ndarray) -> np.ndarray:
    """qs[32c + l] = q[64c + l] | q[64c + 32 + l] << 4, for the 4 chunks of 64 values."""
    chunks = q.reshape(-1, 4, 2, 32) & 0xF
    return (chunks[:, :, 0] | (chunks[:, :, 1] << 4)).reshape(-1, 128).astype(np.uint8)


def _q4_k(x: np.ndarray) -> np.ndarray:
    d, dmin, scales, q = _affine_blocks(x, 15, -1.0, 20)
    return np.concatenate([d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2), scales,
                           _low_nibbles(q)], axis=1)


def _q5_k(x: np.ndarray) -> np.ndarray:
    d, dmin, scales, q = _affine_blocks(x, 31, -0.5, 15)
    high = (q >> 4).reshape(-1, 8, 32)  # bit j of qh[l] is the fifth bit of q[32j + l]
    qh = np.zeros((q.shape[0], 32), dtype=np.uint8)
    for j in range(8):
        qh |= (high[:, j] << j).astype(np.uint8)
    return np.concatenate([d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2), scales, qh,
                           _low_nibbles(q)], axis=1)


def _symmetric_search(x: np.ndarray, nmax: int) -> np.ndarray:
    """Per sub-block (last axis) the signed scale of x ~ scale*q, q in -nmax..nmax-1, weighted by x^2."""
    amax_at = np.abs(x).argmax(-1)
    extreme = np.take_along_axis(x, amax_at[..., None], -1)[..., 0]
    tiny = np.abs(extreme) < 1e-15
    extreme = np.where(tiny, 1.0, extreme)
    w = x * x

    def fit(iscale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        q = np.clip(np.rint(iscale[..., None] * x), -nmax, nmax - 1)
        return (w * x * q).sum(-1), (w * q * q).sum(-1)

    sum_lx, sum_l2 = fit(-nmax / extreme)
    scale = np.where(sum_l2 > 0, sum_lx / np.where(sum_l2 > 0, sum_l2, 1), 0.0)
    best = scale * sum_lx
    for step in range(-9, 10):
        if step == 0:
            continue
        lx, l2 = fit(-(nmax + 0.1 * step) / extreme)
        better = (l2 > 0) & (lx * lx > best * l2)
        scale = np.where(better, lx / np.where(l2 > 0, l2, 1), scale)
        best = np.where(better, scale * lx, best)
    return np.where(tiny, 0.0, scale)


def _q6_k(x: np.ndarray) -> np.ndarray:
    sub = x.reshape(-1, 16, 16)
    scale = _symmetric_search(sub, 32)
    largest = np.take_along_axis(scale, np.abs(scale).argmax(-1)[:, None], -1)[:, 0]
    zero = np.abs(largest) < 1e-15
    iscale = np.where(zero, 0.0, -128.0 / np.where(zero, 1.0, largest))
    d = np.where(zero, 0.0, 1.0 / np.where(zero, 1.0, iscale)).astype(np.float16)
    scales = np.clip(np.rint(iscale[:, None] * scale), -128, 127)
    step = d.astype(np.float32)[:, None] * scales
    q = np.clip(np.rint(sub / np.where(step != 0, step, 1)[..., None]), -32, 31) + 32
    q = np.where((step != 0)[..., None], q, 32).astype(np.uint8).reshape(-1, 2, 4, 32)  # halves of 4 rows of 32
    ql = np.concatenate([(q[:, :, 0] & 0xF) | ((q[:, :, 2] & 0xF) << 4),
                         (q[:, :, 1] & 0xF) | ((q[:, :, 3] & 0xF) << 4)], axis=2).reshape(-1, 128)
    qh = ((q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4) | ((q[:, :, 3] >> 4) << 6))
    return np.concatenate([ql.astype(np.uint8), qh.reshape(-1, 64).astype(np.uint8),
                           scales.astype(np.int8).view(np.uint8), d.view(np.uint8).reshape(-1, 2)], axis=1)


_QUANTIZERS = {"Q4_K": (_q4_k, 144), "Q5_K": (_q5_k, 176), "Q6_K": (_q6_k, 210)}


def quantize_k(data: np.ndarray, kind: str) -> np.ndarray:
    """A float matrix (rows, n) with n a multiple of 256 -> uint8 (rows, n / 256 * block bytes)."""
    quantizer, nbytes = _QUANTIZERS[kind]
    rows, n = data.shape
    if n % QK_K:
        raise ValueError(f"{kind} needs rows of a multiple of {QK_K} values, got {n}")
    blocks = data.astype(np.float32).reshape(-1, QK_K)
    out = np.concatenate([quantizer(blocks[i:i + _CHUNK_BLOCKS]) for i in range(0, len(blocks), _CHUNK_BLOCKS)])
    assert out.shape[1] == nbytes
    return out.reshape(rows, n // QK_K * nbytes)
