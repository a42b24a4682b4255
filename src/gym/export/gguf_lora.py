"""`gym export --format gguf-lora`: a peft LoRA adapter as a GGUF adapter (llama.cpp `--lora`, Ollama `ADAPTER`).

The file holds, for each adapted matrix `X.weight` of the base (GGUF names), `X.weight.lora_a` (r x in) and
`X.weight.lora_b` (out x r), with `general.type = adapter`, `adapter.type = lora` and `adapter.lora.alpha`.
llama.cpp adds `alpha / r * B (A x)` for each pair, r read per tensor. What llama.cpp cannot express is
folded into B: rsLoRA's alpha / sqrt(r) and peft's per-module `alpha_pattern`. For the llama arch the rows of
B of q and k are permuted as the base's q/k are (gym.export.gguf_file.permute_for_llama); A is unchanged.
DoRA (a magnitude vector per matrix) and LoRA on embeddings have no GGUF adapter form: merge them instead
(`--format gguf`).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import gguf
from transformers import AutoConfig

from gym.core.errors import ConfigError
from gym.core.files import make_folder, refuse_overwrite, remove_stale_temps, temp_path
from gym.core.names import split_names
from gym.export.config import ExportArguments
from gym.export.gguf_file import Fallbacks, arch_of, encode_tensor, permute_for_llama
from gym.export.spelling import current_spelling, option
from gym.infer.config import resolve_inference_config
from gym.models.adapters import ADAPTER_WEIGHTS, adapter_weights
from gym.models.loader import resolve_model_path

ADAPTER_TYPES = ("f32", "f16", "bf16", "q8_0")


def _adapter_folder(config: dict[str, Any]) -> tuple[Path, str]:
    resolved = resolve_inference_config(config, untrained="refuse", how=current_spelling().untrained)
    adapters = split_names(resolved.get("adapter_name_or_path"))
    if len(adapters) != 1:
        raise ConfigError("gguf-lora exports one LoRA adapter: give adapter_name_or_path (or the output_dir of a "
                          f"LoRA run); got {len(adapters)} adapters.")
    return Path(adapters[0]), resolve_model_path(resolved.get("model_name_or_path"))


def _module_scale(adapter: dict[str, Any], module: str, rank: int) -> tuple[float, float]:
    """(the scale peft applies to this module, the one llama.cpp will apply: alpha / rank)."""
    alpha = float(adapter["lora_alpha"])
    for pattern, value in (adapter.get("alpha_pattern") or {}).items():
        if module.endswith(pattern) or pattern in module:
            alpha = float(value)
    wanted = alpha / math.sqrt(rank) if adapter.get("use_rslora") else alpha / rank
    return wanted, float(adapter["lora_alpha"]) / rank


def _base_shapes(config: Any) -> dict[str, tuple[int, ...]]:
    """The base's parameter shapes, from its config alone: the model built on the meta device holds no weights."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return {name: tuple(param.shape) for name, param in model.named_parameters()}


def _lora_pairs(adapter_dir: Path, adapter: dict[str, Any], weights: dict[str, Any], base_path: str, config: Any,
                names: Any) -> list[tuple[str, str, Any, Any]]:
    """(module, GGUF name, A, B) for every adapted matrix, each checked against the base's matrix: an adapter
    trained on a base of another size would otherwise be written, and fail (or silently misbehave) only in
    llama.cpp."""
    shapes = _base_shapes(config)
    pairs = []
    for key in sorted(k for k in weights if k.endswith(".lora_A.weight")):
        module = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
        if "embed" in module or "lm_head" in module:
            raise ConfigError(f"{adapter_dir} adapts {module}; GGUF adapters cannot carry LoRA on embeddings: merge "
                              f"it with {option('export_format', 'gguf')}.")
        lora_b_key = key.replace(".lora_A.", ".lora_B.")
        if lora_b_key not in weights:
            raise ConfigError(f"{adapter_dir} has {key} without its {lora_b_key}: the adapter is damaged.")
        lora_a, lora_b = weights[key].float(), weights[lora_b_key].float()
        name = names.get_name(module + ".weight", try_suffixes=(".weight",))
        base = shapes.get(f"{module}.weight")
        trained_on = adapter.get("base_model_name_or_path") or "another model"
        if base is None:
            raise ConfigError(f"{adapter_dir} adapts {module}, which the base {base_path} does not have: it was "
                              f"trained on {trained_on}. Export it against that base.")
        if name is None:
            raise ConfigError(f"gguf-lora: no GGUF name for {module}.")
        if lora_a.dim() != 2 or lora_b.dim() != 2 or lora_a.shape[0] != lora_b.shape[1] or \
                (lora_b.shape[0], lora_a.shape[1]) != base:
            raise ConfigError(f"{adapter_dir} does not fit the base {base_path}: {module} is "
                              f"{base[0]}x{base[1]} there, and the adapter's B ({tuple(lora_b.shape)}) times A "
                              f"({tuple(lora_a.shape)}) is not. It was trained on {trained_on}: export it against "
                              "that base.")
        pairs.append((module, name, lora_a, lora_b))
    if not pairs:
        raise ConfigError(f"{adapter_dir} holds no LoRA weights (an empty adapter).")
    return pairs


def write_gguf_lora(adapter_dir: Path, base_path: str, path: Path, gguf_type: str = "f32") -> Path:
    if gguf_type not in ADAPTER_TYPES:
        raise ConfigError(f"gguf-lora is written as {', '.join(ADAPTER_TYPES)}; got {gguf_type!r}.")
    adapter = json.loads((adapter_dir / "adapter_config.json").read_text())
    if adapter.get("peft_type") != "LORA":
        raise ConfigError(f"{adapter_dir} is a {adapter.get('peft_type')} adapter; gguf-lora exports LoRA adapters "
                          f"(merge others with {option('export_format', 'gguf')}).")
    if adapter.get("use_dora"):
        raise ConfigError(f"{adapter_dir} is a DoRA adapter, which a GGUF adapter cannot carry: merge it with "
                          f"{option('export_format', 'gguf')}.")
    weights = adapter_weights(adapter_dir / ADAPTER_WEIGHTS)  # a damaged file, or NaN/inf in it, named
    config = AutoConfig.from_pretrained(base_path)
    arch = arch_of(config)
    names = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
    pairs = _lora_pairs(adapter_dir, adapter, weights, base_path, config, names)  # checked before the file opens
    qtype = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
             "bf16": gguf.GGMLQuantizationType.BF16, "q8_0": gguf.GGMLQuantizationType.Q8_0}[gguf_type]
    writer = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[arch])
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_name(adapter_dir.name)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(adapter["lora_alpha"]))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    fallbacks = Fallbacks()
    for module, name, lora_a, lora_b in pairs:
        wanted, applied = _module_scale(adapter, module, lora_a.shape[0])
        lora_b = lora_b * (wanted / applied)
        if arch == gguf.MODEL_ARCH.LLAMA and module.endswith("q_proj"):
            lora_b = permute_for_llama(lora_b, config.num_attention_heads)
        elif arch == gguf.MODEL_ARCH.LLAMA and module.endswith("k_proj"):
            lora_b = permute_for_llama(lora_b, config.num_key_value_heads or config.num_attention_heads)
        for suffix, tensor in ((".lora_a", lora_a), (".lora_b", lora_b)):
            data, stored = encode_tensor(tensor, qtype)
            fallbacks.note(tensor, qtype, stored)
            writer.add_tensor(name + suffix, data, raw_dtype=stored if stored not in (
                gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16) else None)
    fallbacks.warn(f"GGUF adapter {gguf_type}")  # a B of rank under 32 never fills a q8_0 block
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def export_gguf_lora(args: ExportArguments, config: dict[str, Any]) -> Path:
    assert args.export_dir is not None
    adapter_dir, base_path = _adapter_folder(config)
    gguf_type = args.export_type or "f32"
    target = Path(args.export_dir)
    out = target if target.suffix == ".gguf" else target / f"{adapter_dir.name}-lora-{gguf_type.upper()}.gguf"
    refuse_overwrite(out, args.export_overwrite, option("export_overwrite", True))
    make_folder(out.parent)
    remove_stale_temps(out.parent)
    tmp = temp_path(out)
    try:
        write_gguf_lora(adapter_dir, base_path, tmp, gguf_type)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out
