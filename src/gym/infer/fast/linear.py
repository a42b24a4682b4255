"""A linear layer at the precision the engine serves: float32, bfloat16, float16, int8 or int4.

Every product, a decode step's few rows and a prompt chunk's many, goes through the kernels
(gym.infer.fast.kernels), which compute each row the same way whatever rows share the call. A BLAS matrix
product was faster for long prompt chunks (bf16 on CPUs that multiply it natively), but its rounding
depends on how many rows it multiplies together, so a prompt's numbers, and then the greedy answer,
depended on how it was chunked and on the prefix cache: a request must answer the same alone and under load.
"""

from __future__ import annotations

import torch

from gym.infer.fast import kernels

SERVED_DTYPES = ("float32", "bfloat16", "float16", "int8", "int4")
KERNEL_ROWS = 16  # up to this many rows a decode step runs every layer in one kernel call (decode_layers)


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

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.dtype == "int8":
            assert self.scale is not None
            y = kernels.linear_int8(x, self.weight, self.scale)
        elif self.dtype == "int4":
            assert self.scale is not None
            y = kernels.linear_int4(x, self.weight, self.scale)
        else:
            y = kernels.linear_float(x, self.weight)
        if self.bias is not None:
            y += self.bias
        return y
