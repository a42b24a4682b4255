"""The GPU decoder's view of a layer: its weights (q/k/v and gate/up fused side by side, so each is one
product) and the elementwise pieces computed as transformers computes them (gym.infer.fast.gpu)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class GpuLayer:
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: torch.Tensor  # q, k and v projections side by side
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    gate_up: torch.Tensor  # gate and up projections side by side
    down: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None


def fused(modules: list[Any]) -> torch.Tensor:
    """The modules' weights side by side; the modules then view into it, so the model is not held twice."""
    weight = torch.cat([m.weight.detach() for m in modules])
    start = 0
    for module in modules:
        rows = module.weight.shape[0]
        module.weight.data = weight[start:start + rows]
        start += rows
    return weight


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # transformers' order of operations: normalize in float32, back to the model dtype, then scale.
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def gpu_layer(layer: Any) -> GpuLayer:
    """A transformers Llama-family layer's weights as the GPU decoder reads them."""
    attention, mlp = layer.self_attn, layer.mlp
    projections = (attention.q_proj, attention.k_proj, attention.v_proj)
    qkv_bias = None if all(m.bias is None for m in projections) else torch.cat([
        m.bias.detach() if m.bias is not None else torch.zeros_like(m.weight[:, 0]) for m in projections])
    for module in (attention.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj):
        if getattr(module, "bias", None) is not None:
            raise ValueError("the GPU decoder implements bias-free o/MLP projections")
    q_norm = getattr(attention, "q_norm", None)
    k_norm = getattr(attention, "k_norm", None)
    return GpuLayer(
        input_norm=layer.input_layernorm.weight.detach(), post_norm=layer.post_attention_layernorm.weight.detach(),
        qkv=fused([attention.q_proj, attention.k_proj, attention.v_proj]), qkv_bias=qkv_bias,
        o=attention.o_proj.weight.detach(), gate_up=fused([mlp.gate_proj, mlp.up_proj]),
        down=mlp.down_proj.weight.detach(),
        q_norm=q_norm.weight.detach() if q_norm is not None else None,
        k_norm=k_norm.weight.detach() if k_norm is not None else None)
