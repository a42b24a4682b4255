"""What a Llama-family decoder is, said once for the fast engine's CPU decoder (cpu.py), its GPU decoder
(gpu.py) and the per-row deltas (deltas.py): what the config says (`DecoderSpec`), which weights a layer
has, under which keys, fused into which products (`layer_products`, `layer_norms`, `Layer`, `Weights`),
and the rotary tables. A decoder adds only how it holds a product (packed FastLinear on the CPU, a weight
and bias on the GPU) and a norm weight (float32 on the CPU, the model's dtype on the GPU), and its own
forward pass.

One layer, in forward order, for every family it implements (llama, mistral, qwen2, qwen3):

    q, k, v = qkv(input_norm(x));  q, k = q_norm(q), k_norm(k) where the family norms them (Qwen3)
    x += o(attention(rope(q), rope(k), v))
    gate, up = gate_up(post_norm(x));  x += down(silu(gate) * up)

then logits = head(norm(x)), the head being the embedding itself where the model ties them. A weight is
addressed as "<layer>.<key>" ("3.qkv", "3.q_norm"), or "embed", "norm", "head" outside the layers: the
keys the per-row deltas are filed under.

transformers loads the weights and supplies the rotary tables (so every RoPE scaling it knows is
honoured); `unsupported_reason` names what rules a model out, and the engine then uses the transformers
path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch

from gym.models.base_quantization import is_quantized

SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "qwen3")

P = TypeVar("P")  # how a decoder holds a product (the weights of one or more projections side by side)
N = TypeVar("N")  # how it holds a norm's weight


@dataclass(frozen=True)
class DecoderSpec:
    """The shape of a Llama-family decoder, read from its transformers config."""

    model_type: str
    layers: int
    heads: int
    kv_heads: int  # fewer than heads under grouped-query attention: heads // kv_heads queries share a key head
    head_dim: int
    eps: float  # the RMSNorms' epsilon
    rope_type: str  # "default", "llama3", "linear", "yarn"...: the model's rotary module computes each
    rope_theta: float
    max_positions: int  # positions it attends in full: its position limit, capped by any sliding window
    tied_embeddings: bool  # the LM head is the embedding matrix
    hidden_act: str
    sliding_layers: bool  # some layers attend through a sliding window only

    @classmethod
    def from_config(cls, config: Any) -> DecoderSpec:
        heads = config.num_attention_heads
        rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
        limit = getattr(config, "max_position_embeddings", 4096)
        if getattr(config, "sliding_window", None):
            limit = min(limit, config.sliding_window)  # beyond the window the model attends differently
        layer_types = getattr(config, "layer_types", None) or []
        return cls(
            model_type=config.model_type, layers=config.num_hidden_layers, heads=heads,
            kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads, eps=config.rms_norm_eps,
            # transformers 5 keeps theta in rope_parameters, 4 beside rope_scaling.
            rope_type=rope.get("rope_type", rope.get("type")) or "default",
            rope_theta=float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))),
            max_positions=limit, tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            hidden_act=getattr(config, "hidden_act", "silu"),
            sliding_layers=bool(getattr(config, "use_sliding_window", False))
            or any(t != "full_attention" for t in layer_types))

    def max_length(self, wanted: int | None) -> int:
        """Positions a decoder's cache holds: `wanted` (None: as many as the model attends), at most that."""
        return min(wanted or self.max_positions, self.max_positions)

    def __str__(self) -> str:
        groups = f" ({self.kv_heads} key/value)" if self.kv_heads != self.heads else ""
        return (f"{self.model_type}, {self.layers} layers of {self.heads} heads{groups} x {self.head_dim}, "
                f"RoPE {self.rope_type} theta {self.rope_theta:g}")


def unsupported_reason(model: Any) -> str | None:
    """Why the fast decoders cannot run this model, or None when they can."""
    config: Any = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_TYPES:
        return f"model type {model_type!r} is not one it implements ({', '.join(SUPPORTED_TYPES)})"
    if is_quantized(model):
        return ("the base is quantized on load (quantization_bit), and the fast engine quantizes float weights "
                "itself (infer_dtype: int8/int4)")
    device = next(model.parameters()).device
    if device.type not in ("cpu", "cuda"):
        return f"it runs on the CPU or a CUDA GPU and the model is on {device}"
    spec = DecoderSpec.from_config(config)
    if spec.hidden_act != "silu":
        return f"hidden_act {spec.hidden_act!r} (it implements silu)"
    if spec.rope_type in ("dynamic", "longrope"):
        return f"RoPE type {spec.rope_type!r} depends on the sequence length"
    if spec.sliding_layers:
        return "it uses sliding-window attention"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        return "its modules are not laid out as a transformers Llama-family model"
    return None


# -- a layer's weights ---------------------------------------------------------------------------------
def layer_products(layer: Any) -> dict[str, list[Any]]:
    """A transformers decoder layer's products by key, in forward order: the projection modules whose
    outputs one product computes side by side (q, k and v in one; gate and up in one)."""
    attention, mlp = layer.self_attn, layer.mlp
    return {"qkv": [attention.q_proj, attention.k_proj, attention.v_proj], "o": [attention.o_proj],
            "gate_up": [mlp.gate_proj, mlp.up_proj], "down": [mlp.down_proj]}


def layer_norms(layer: Any) -> dict[str, Any]:
    """A transformers decoder layer's RMSNorm modules by key; q_norm and k_norm only where the family has
    them."""
    norms = {"input_norm": layer.input_layernorm, "post_norm": layer.post_attention_layernorm}
    for key in ("q_norm", "k_norm"):
        if (module := getattr(layer.self_attn, key, None)) is not None:
            norms[key] = module
    return norms


def fuse(modules: Sequence[Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The modules' weights side by side, and their biases (zeros for a module without one; None when
    none has one): one product computing every module's outputs. One module's weight is its own tensor."""
    weights = [m.weight.detach() for m in modules]
    return weights[0] if len(weights) == 1 else torch.cat(weights), fuse_bias(modules)


def fuse_bias(modules: Sequence[Any]) -> torch.Tensor | None:
    """The modules' biases side by side as `fuse` lays them out (without fusing their weights)."""
    biases = [getattr(m, "bias", None) for m in modules]
    if all(b is None for b in biases):
        return None
    return torch.cat([b.detach() if b is not None else m.weight.new_zeros(m.weight.shape[0])
                      for m, b in zip(modules, biases)])


def share(modules: Sequence[Any], weight: torch.Tensor) -> None:
    """The modules' weights become views into `weight` (their fused copy, as `fuse` laid it out), so the
    model is not held twice."""
    if len(modules) == 1:
        return
    start = 0
    for module in modules:
        rows = module.weight.shape[0]
        module.weight.data = weight[start:start + rows]
        start += rows


@dataclass(frozen=True)
class Layer(Generic[P, N]):
    """One decoder layer's weights as a decoder holds them, in forward order."""

    input_norm: N
    qkv: P  # q, k and v projections side by side
    q_norm: N | None
    k_norm: N | None
    o: P
    post_norm: N
    gate_up: P  # gate and up projections side by side
    down: P


@dataclass(frozen=True)
class Weights(Generic[P, N]):
    """A model's weights as a decoder holds them: `product(key, modules)` makes one product of the modules'
    weights ("qkv", "o", "gate_up", "down" or "head"), `norm(weight)` holds a norm's weight."""

    embed: torch.Tensor  # [vocab, hidden]: the model's own tensor (rows are looked up, never multiplied)
    layers: list[Layer[P, N]]
    norm: N
    head: P

    @classmethod
    def read(cls, model: Any, product: Callable[[str, list[Any]], P],
             norm: Callable[[torch.Tensor], N]) -> Weights[P, N]:
        inner = model.model

        def norm_of(module: Any) -> N:
            return norm(module.weight.detach())

        layers = []
        for layer in inner.layers:
            products, norms = layer_products(layer), layer_norms(layer)
            q_norm, k_norm = norms.get("q_norm"), norms.get("k_norm")
            layers.append(Layer(
                input_norm=norm_of(norms["input_norm"]), qkv=product("qkv", products["qkv"]),
                q_norm=norm_of(q_norm) if q_norm is not None else None,
                k_norm=norm_of(k_norm) if k_norm is not None else None,
                o=product("o", products["o"]), post_norm=norm_of(norms["post_norm"]),
                gate_up=product("gate_up", products["gate_up"]), down=product("down", products["down"])))
        return cls(embed=inner.embed_tokens.weight.detach(), layers=layers, norm=norm_of(inner.norm),
                   head=product("head", [model.get_output_embeddings()]))


def rotary_tables(model: Any, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [length, head_dim] float32 of positions 0..length-1, from the model's own rotary
    embedding (each decoder casts them to the dtype it computes in)."""
    positions = torch.arange(length, device=device)[None, :]
    probe = torch.zeros(1, dtype=torch.float32, device=device)
    with torch.no_grad():
        cos, sin = model.model.rotary_emb(probe, positions)
    return cos[0], sin[0]
