"""A linear layer at the precision the engine serves: float32, bfloat16, float16, int8 or int4.

Decode steps (a few rows) go through the kernels, which read each weight once; a prefill chunk (many
rows) is a real matrix product, where a BLAS library is the right tool. That product runs in bfloat16
for the sub-float32 formats where the CPU multiplies bf16 natively (AVX512-BF16/AMX: 2.3x a float32
product for a 1024x576 @ 576x3072 chunk here), else in float32; int8/int4 weights are expanded for it one
layer at a time, so the expanded copy is transient. float32 weights always multiply in float32.
"""

from __future__ import annotations

import torch

from gym.core.hardware import cpu_supports_bf16
from gym.infer.fast import kernels

_PREFILL_BF16 = cpu_supports_bf16()

SERVED_DTYPES = ("float32", "bfloat16", "float16", "int8", "int4")
KERNEL_ROWS = 16  # up to this many rows, the matrix-vector kernels beat a BLAS product
# Up to this many rows, int8/int4 layers run the kernels 16 rows at a time: expanding a whole model's
# weights for one matrix product costs ~0.2 s on the embedded model, as much as ~80 rows of kernels.
SLICED_ROWS = 64


class FastLinear:
    """y = x @ W.T + b for x [rows, in] float32, with W stored as `dtype`."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: str) -> None:
        if dtype not in SERVED_DTYPES:
            raise ValueError(f"unknown served dtype {dtype!r}")
        if dtype in ("int8", "int4") and not kernels.packable(weight):
            dtype = "float32"  # shapes the block format cannot hold stay exact
        self.dtype = dtype
        self.out_features, self.in_features = weight.shape
        self.bias = bias.detach().float().contiguous() if bias is not None else None
        self.scale: torch.Tensor | None = None
        if dtype == "int8":
            self.weight, self.scale = kernels.pack_int8(weight)
        elif dtype == "int4":
            self.weight, self.scale = kernels.pack_int4(weight)
        else:
            target = getattr(torch, dtype)
            # A weight already in the served dtype is used as it is: no second copy of the model.
            self.weight = weight.detach().to(target).contiguous()

    @property
    def nbytes(self) -> int:
        total = self.weight.numel() * self.weight.element_size()
        if self.scale is not None:
            total += self.scale.numel() * self.scale.element_size()
        return total

    def dense(self) -> torch.Tensor:
        """The weight as float32 (what the quantized formats stand for)."""
        if self.dtype == "int8":
            assert self.scale is not None
            return kernels.unpack_int8(self.weight, self.scale)
        if self.dtype == "int4":
            assert self.scale is not None
            return kernels.unpack_int4(self.weight, self.scale)
        return self.weight.float()

    def __call__(self, x: torch.Tensor, expanded: torch.Tensor | None = None) -> torch.Tensor:
        """`expanded`: this layer's weight as `_expanded()` gives it, when the caller already made it."""
        if self.scale is not None and KERNEL_ROWS < x.shape[0] <= SLICED_ROWS:
            return torch.cat([self(part) for part in x.split(KERNEL_ROWS)])
        if x.shape[0] <= KERNEL_ROWS:
            if self.dtype == "int8":
                assert self.scale is not None
                y = kernels.linear_int8(x, self.weight, self.scale)
            elif self.dtype == "int4":
                assert self.scale is not None
                y = kernels.linear_int4(x, self.weight, self.scale)
            else:
                y = kernels.linear_float(x, self.weight)
        else:
            # The activations stay unquantized here: the kernels round them to int8 because that is what
            # makes an integer dot product possible, not for accuracy, and a product of many rows needs none.
            weight = self._expanded() if expanded is None else expanded
            y = x @ weight.T if weight.dtype == torch.float32 else (x.to(weight.dtype) @ weight.T).float()
        if self.bias is not None:
            y += self.bias
        return y

    def each(self, parts: list[torch.Tensor]) -> torch.Tensor:
        """self(part) for each part, concatenated. Each part's rows get exactly what self(part) alone gives
        (a matrix product's rounding may depend on the rows that share it, and a request's answer must
        not depend on which others were prefilled with it); int weights are expanded once for all parts."""
        expanded = None
        outs = []
        for part in parts:
            if expanded is None and part.shape[0] > (SLICED_ROWS if self.scale is not None else KERNEL_ROWS):
                expanded = self._expanded()
            outs.append(self(part, expanded))
        return torch.cat(outs)

    def _expanded(self) -> torch.Tensor:
        """The weight for a matrix product of many rows: float32 for float32 weights; bf16 for the other
        formats where the CPU multiplies bf16 natively; else float32."""
        if self.dtype == "float32":
            return self.weight
        if _PREFILL_BF16:
            return self.dense().bfloat16() if self.scale is not None else self.weight.bfloat16()
        return self.dense()
