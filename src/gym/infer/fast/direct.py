"""A Llama-family model read straight from its folder (config.json and safetensors files) for the fast engine, without
transformers' model classes.

Importing transformers' modeling code and building its model object cost ~2 s of a 4-5 s `gym chat` start on the
embedded model, and the fast decoders use neither: they read the config, the weights by module, and the rotary tables
(gym.infer.fast.decoder). `DirectModel` is those three and nothing more. It is a tree of torch modules named as
transformers names them ("model.layers.3.self_attn.q_proj"), so `named_parameters()`, the packed-weight cache's keys and
the delta tools see the same model; its weights are the safetensors files mapped copy-on-write (nothing is read until it
is used, and writing to one changes this process's copy, never the file). It has no forward pass.

`load_direct(folder)` returns None, with the reason, for anything it does not read exactly as transformers would: a
family outside gym.infer.fast.decoder's, a config leaving out a value whose default differs between families, RoPE
other than the default, weights that are not one float dtype, or names it does not expect. The caller then loads the
model with transformers, as before.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gym.infer.fast.decoder import SUPPORTED_TYPES

# What a config must say for DecoderSpec to read it as transformers would: these keys' defaults differ by family or
# version, so a config without them goes to transformers.
REQUIRED_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "rms_norm_eps",
                 "vocab_size", "max_position_embeddings")
# What the four families' configs default to alike, as transformers fills them in.
SHARED_DEFAULTS = {"hidden_act": "silu", "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
                   "use_sliding_window": False}
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class DirectConfig:
    """config.json's values as attributes (what DecoderSpec.from_config and the engines read, with the defaults
    transformers fills in for the family); a key it does not give is an AttributeError, as on a transformers
    config."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class Weight(nn.Module):
    """A projection's or norm's tensors under transformers' names: `weight`, and `bias` where the files have one."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    @classmethod
    def tied(cls, other: Weight) -> Weight:
        """A second module holding `other`'s very parameter (a head tied to the embedding, as transformers ties
        them): named_parameters() lists it once, named_modules() under both names."""
        module = cls(other.weight)
        module.weight = other.weight
        return module


class DefaultRotary(nn.Module):
    """transformers' default rotary embedding: cos and sin of position * theta^(-2i/dim), computed as it does (float32,
    the frequencies repeated for both halves), so the tables are equal to its own."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
        self.inv_freq = 1.0 / (theta ** exponents)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].to(torch.float32) * self.inv_freq.to(x.device)
        table = torch.cat((freqs, freqs), dim=-1)
        return table.cos().to(x.dtype), table.sin().to(x.dtype)


class Namespace(nn.Module):
    """A module that only holds others (transformers' self_attn, mlp, a decoder layer), keeping their names."""

    def __init__(self, **children: nn.Module) -> None:
        super().__init__()
        for name, child in children.items():
            self.add_module(name, child)


class Inner(nn.Module):
    def __init__(self, embed_tokens: Weight, layers: list[nn.Module], norm: Weight, rotary_emb: DefaultRotary) -> None:
        super().__init__()
        self.embed_tokens, self.layers = embed_tokens, nn.ModuleList(layers)
        self.norm, self.rotary_emb = norm, rotary_emb


class DirectModel(nn.Module):
    """A decoder-only model's weights and config, laid out as transformers' *ForCausalLM lays them out."""

    def __init__(self, config: DirectConfig, model: Inner, lm_head: Weight, folder: Path) -> None:
        super().__init__()
        self.config, self.model, self.lm_head, self.folder = config, model, lm_head, folder
        self.name_or_path = str(folder)

    def get_input_embeddings(self) -> Weight:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> Weight:
        return self.lm_head

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")


def _read_config(folder: Path) -> dict[str, Any] | str:
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        return f"its config.json cannot be read ({exc})"
    if not isinstance(config, dict):
        return "its config.json is not an object"
    if config.get("model_type") not in SUPPORTED_TYPES:
        return f"model type {config.get('model_type')!r} is not one the fast engine implements"
    missing = [key for key in REQUIRED_KEYS if key not in config]
    if missing:
        return f"its config.json leaves out {', '.join(missing)}"
    family = config["model_type"]
    if family == "mistral" and "sliding_window" not in config:
        return "its config.json leaves out sliding_window (Mistral's default is 4096)"
    if family == "qwen3" and "head_dim" not in config:
        return "its config.json leaves out head_dim (Qwen3's default is 128)"
    for key, value in SHARED_DEFAULTS.items():
        config.setdefault(key, value)
    if family in ("qwen2", "qwen3") and not config["use_sliding_window"]:
        config["sliding_window"] = None  # as their transformers configs do: the window is off
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if (rope.get("rope_type") or rope.get("type") or "default") != "default":
        return f"RoPE type {rope.get('rope_type') or rope.get('type')!r} (it computes the default only)"
    if "rope_theta" not in rope and "rope_theta" not in config:
        return "its config.json gives no rope_theta"
    if "auto_map" in config:
        return "it brings its own modeling code (auto_map)"
    if "quantization_config" in config:
        return "its weights are quantized (quantization_config)"
    if config.get("partial_rotary_factor", 1.0) != 1.0:
        return "it rotates part of each head only (partial_rotary_factor)"
    return config


def _open_weights(folder: Path) -> dict[str, torch.Tensor] | str:
    from safetensors import SafetensorError, safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return "it has no safetensors files"
    tensors: dict[str, torch.Tensor] = {}
    try:
        for file in files:
            # framework="pt" maps the file copy-on-write: tensors cost nothing until read, and a write stays ours.
            with safe_open(str(file), framework="pt") as handle:
                for name in handle.keys():  # noqa: SIM118 (not iterable)
                    tensors[name] = handle.get_tensor(name)
    except (SafetensorError, OSError, RuntimeError) as exc:
        return f"its weights cannot be read ({exc})"
    dtypes = {tensor.dtype for tensor in tensors.values()}
    if len(dtypes) != 1 or not dtypes <= set(FLOAT_DTYPES):
        return f"its weights are not of one float dtype ({', '.join(sorted(str(d) for d in dtypes))})"
    return tensors


def load_direct(folder: str | Path, dtype: torch.dtype = torch.float32) -> tuple[DirectModel | None, str | None]:
    """(the model with its weights in `dtype`, None), or (None, why it is left to transformers). Weights stored in
    `dtype` are the files' own pages; others are converted, as transformers would load them."""
    path = Path(folder)
    config = _read_config(path)
    if isinstance(config, str):
        return None, config
    tensors = _open_weights(path)
    if isinstance(tensors, str):
        return None, tensors
    tensors = {name: tensor if tensor.dtype == dtype else tensor.to(dtype) for name, tensor in tensors.items()}
    try:
        model = _build(path, config, tensors)
    except KeyError as exc:
        return None, f"its weights have no {exc.args[0]}"
    unused = sorted(set(tensors) - {name for name, _ in model.named_parameters(remove_duplicate=False)})
    if unused:
        return None, f"its weights have {len(unused)} tensor(s) the fast engine does not use ({unused[0]}, ...)"
    return model, None


def _biased(config: dict[str, Any]) -> set[str]:
    """The projections that have a bias in this family and config, as transformers builds them."""
    family = config["model_type"]
    if family == "qwen2":
        return {"q_proj", "k_proj", "v_proj"}
    attention = {"q_proj", "k_proj", "v_proj", "o_proj"} if family != "mistral" and config["attention_bias"] else set()
    mlp = {"gate_proj", "up_proj", "down_proj"} if family == "llama" and config["mlp_bias"] else set()
    return attention | mlp


def _build(folder: Path, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> DirectModel:
    biased = _biased(config)

    def weight(prefix: str, bias: bool = False) -> Weight:
        return Weight(tensors[f"{prefix}.weight"], tensors[f"{prefix}.bias"] if bias else None)

    layers: list[nn.Module] = []
    for index in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{index}"
        attention: dict[str, nn.Module] = {name: weight(f"{prefix}.self_attn.{name}", bias=name in biased)
                                           for name in ("q_proj", "k_proj", "v_proj", "o_proj")}
        if config["model_type"] == "qwen3":  # the family that norms queries and keys per head
            attention.update(q_norm=weight(f"{prefix}.self_attn.q_norm"), k_norm=weight(f"{prefix}.self_attn.k_norm"))
        mlp = Namespace(**{name: weight(f"{prefix}.mlp.{name}", bias=name in biased)
                           for name in ("gate_proj", "up_proj", "down_proj")})
        layers.append(Namespace(self_attn=Namespace(**attention), mlp=mlp,
                                input_layernorm=weight(f"{prefix}.input_layernorm"),
                                post_attention_layernorm=weight(f"{prefix}.post_attention_layernorm")))
    embed = weight("model.embed_tokens")
    head = Weight.tied(embed) if config["tie_word_embeddings"] else weight("lm_head")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    theta = float(rope.get("rope_theta", config.get("rope_theta", 0.0)))
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    inner = Inner(embed, layers, weight("model.norm"), DefaultRotary(head_dim, theta))
    return DirectModel(DirectConfig(config), inner, head, folder)
