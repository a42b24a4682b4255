"""A linear layer at the precision the engine serves: float32, bfloat16, float16, int8 or int4.

Every product, a decode step's few rows and a prompt chunk's many, goes through the kernels
(gym.infer.fast.kernels), which compute each row the same way whatever rows share the call. A BLAS matrix
product was faster for long prompt chunks (bf16 on CPUs that multiply it natively), but its rounding
depends on how many rows it multiplies together, so a prompt's numbers, and then the greedy answer,
depended on how it was chunked and on the prefix cache: a request must answer the same alone and under load.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gym.infer.fast import kernels

SERVED_DTYPES = ("float32", "bfloat16", "float16", "int8", "int4")
KERNEL_ROWS = 16  # up to this many rows a decode step runs every layer in one kernel call (decode_layers)

# (weight, "int8" | "int4") -> (packed weight, scales) in the kernels' layout.
Packer = Callable[[torch.Tensor, str], tuple[torch.Tensor, torch.Tensor]]


def pack(weight: torch.Tensor, dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    return kernels.pack_int8(weight) if dtype == "int8" else kernels.pack_int4(weight)


class FastLinear:
    """y = x @ W.T + b for x [rows, in] float32, with W stored as `dtype`. `packer` packs an int8/int4 weight
    (a PackCache's, which remembers packings across starts: gym.infer.fast.pack_cache)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: str, packer: Packer = pack) -> None:
        if dtype not in SERVED_DTYPES:
            raise ValueError(f"unknown served dtype {dtype!r}")
        if dtype in ("int8", "int4") and not kernels.packable(weight):
            dtype = "float32"  # shapes the block format cannot hold stay exact
        self.dtype = dtype
        self.out_features, self.in_features = weight.shape
        self.bias = bias.detach().float().contiguous() if bias is not None else None
        self.scale: torch.Tensor | None = None
        if dtype in ("int8", "int4"):
            self.weight, self.scale = packer(weight, dtype)
        else:
            target = getattr(torch, dtype)
            # A weight already in the served dtype is used as it is: no second copy of the model.
            self.weight = weight.detach().to(target).contiguous()

    @classmethod
    def prepacked(cls, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, dtype: str,
                  in_features: int) -> FastLinear:
        """A layer from weights packed before (gym.infer.fast.pack_cache), as __init__ would have packed them."""
        linear = cls.__new__(cls)
        linear.dtype, linear.weight, linear.scale = dtype, weight, scale
        linear.out_features, linear.in_features = weight.shape[0], in_features
        linear.bias = bias.detach().float().contiguous() if bias is not None else None
        return linear

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
