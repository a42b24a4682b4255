"""Bit packing: exact layout, round trips for every width, and loud failures on bad input."""

from __future__ import annotations

import math

import pytest
import torch

from gym.delta.bitpack import pack, packed_size, unpack


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("numel", [1, 7, 9, 1001])
def test_round_trip_and_size(bits, numel):
    g = torch.Generator().manual_seed(numel * 10 + bits)
    codes = torch.randint(0, 2**bits, (numel,), generator=g, dtype=torch.int64)
    packed = pack(codes, bits)
    assert packed.dtype == torch.uint8 and packed.dim() == 1
    assert packed.numel() == math.ceil(numel * bits / 8) == packed_size(numel, bits)
    out = unpack(packed, bits, numel)
    assert out.dtype == torch.uint8 and out.shape == (numel,)
    assert torch.equal(out.long(), codes)


def test_any_shape_and_int_dtype_flatten_in_order():
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (3, 5, 7), generator=g, dtype=torch.int32)
    assert torch.equal(unpack(pack(codes, 4), 4, codes.numel()), codes.reshape(-1).to(torch.uint8))
    assert torch.equal(pack(codes, 4), pack(codes.to(torch.uint8).reshape(-1), 4))


def test_exact_byte_layout_lowest_bits_first():
    # bits=2: codes land at offsets 0, 2, 4, 6 -> 0b00_11_10_01
    assert pack(torch.tensor([1, 2, 3, 0]), 2).tolist() == [0b00111001]
    # bits=1: element i is bit i; the second byte holds element 8 and zero padding.
    assert pack(torch.tensor([1, 0, 0, 0, 0, 0, 0, 1, 1]), 1).tolist() == [0b10000001, 0b00000001]
    # bits=4: low nibble first, a trailing odd code is zero-padded.
    assert pack(torch.tensor([0xA, 0x3, 0xF]), 4).tolist() == [0x3A, 0x0F]
    assert pack(torch.tensor([200, 7]), 8).tolist() == [200, 7]


def test_empty():
    packed = pack(torch.zeros(0, dtype=torch.int64), 2)
    assert packed.numel() == 0
    assert unpack(packed, 2, 0).numel() == 0


@pytest.mark.parametrize("bits,bad", [(1, 2), (2, 4), (4, 16), (8, 256), (4, -1)])
def test_out_of_range_codes_raise(bits, bad):
    with pytest.raises(ValueError, match="must lie in"):
        pack(torch.tensor([0, bad, 1]), bits)


def test_bad_bits_and_float_codes_raise():
    with pytest.raises(ValueError, match="bits must be one of"):
        pack(torch.tensor([0, 1]), 3)
    with pytest.raises(ValueError, match="integer tensor"):
        pack(torch.tensor([0.0, 1.0]), 2)


def test_truncated_or_mismatched_input_raises():
    packed = pack(torch.ones(9, dtype=torch.int64), 1)  # 2 bytes
    with pytest.raises(ValueError, match="truncated"):
        unpack(packed[:1], 1, 9)
    with pytest.raises(ValueError, match="need 1 bytes, got 2"):
        unpack(packed, 1, 8)
    with pytest.raises(ValueError, match="uint8"):
        unpack(packed.to(torch.int32), 1, 9)
