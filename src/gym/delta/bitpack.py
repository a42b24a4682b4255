"""Bit packing of small integer codes into bytes.

Quantized deltas store 1, 2, 4 or 8 bits per weight; packing them densely is what makes a 1-bit delta
take 1/16 of the bf16 size on disk. The layout is fixed so files stay readable: element i of the
flattened codes lands in byte (i * bits) // 8 at bit offset (i * bits) % 8, lowest bits first, and the
last byte is zero-padded.
"""

from __future__ import annotations

import torch

VALID_BITS = (1, 2, 4, 8)


def _check_bits(bits: int) -> None:
    if bits not in VALID_BITS:
        raise ValueError(f"bits must be one of {VALID_BITS}, got {bits!r}")


def packed_size(numel: int, bits: int) -> int:
    """Bytes needed to pack `numel` codes of `bits` bits each."""
    _check_bits(bits)
    return (numel * bits + 7) // 8


def _shifts(bits: int) -> torch.Tensor:
    # Bit offset of each code slot within a byte, lowest slot first.
    return torch.arange(0, 8, bits, dtype=torch.uint8)


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack integer codes (any shape, values in [0, 2**bits)) into a 1-D uint8 tensor of
    `packed_size(codes.numel(), bits)` bytes."""
    _check_bits(bits)
    if codes.is_floating_point() or codes.is_complex():
        raise ValueError(f"pack expects an integer tensor, got {codes.dtype}")
    flat = codes.reshape(-1)
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= 2**bits):
        raise ValueError(
            f"codes must lie in [0, {2**bits}) for {bits}-bit packing, "
            f"got values in [{int(flat.min())}, {int(flat.max())}]"
        )
    flat = flat.to(torch.uint8)
    if bits == 8:
        return flat.clone()
    per_byte = 8 // bits
    pad = -flat.numel() % per_byte
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    # Slots never overlap, so summing the shifted codes is the same as OR-ing them and cannot overflow.
    return (flat.reshape(-1, per_byte) << _shifts(bits)).sum(dim=1, dtype=torch.uint8)


def unpack(packed: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    """Inverse of `pack`: the first `numel` codes as a 1-D uint8 tensor.

    `packed` must hold exactly `packed_size(numel, bits)` bytes: a shorter buffer is a truncated file and a
    longer one means `numel` or `bits` does not match what was packed; both raise ValueError rather than
    decode garbage.
    """
    _check_bits(bits)
    if packed.dtype != torch.uint8:
        raise ValueError(f"unpack expects a uint8 tensor, got {packed.dtype}")
    if numel < 0:
        raise ValueError(f"numel must be >= 0, got {numel}")
    needed = packed_size(numel, bits)
    if packed.numel() != needed:
        raise ValueError(
            f"{numel} codes of {bits} bits need {needed} bytes, got {packed.numel()} "
            "(truncated or mismatched data)"
        )
    flat = packed.reshape(-1)
    if bits == 8:
        return flat.clone()
    mask = (1 << bits) - 1
    codes = (flat.unsqueeze(1) >> _shifts(bits)) & mask
    return codes.reshape(-1)[:numel].contiguous()
