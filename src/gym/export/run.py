"""One entry point for every export format, used by `gym export` and `Trainer.export`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gym.export.config import parse_export
from gym.personalization.store import variant_source


def run_export(config: dict[str, Any]) -> Path:
    """Export what `config` names (the model keys of `gym chat`, plus export_dir, export_format, ...)."""
    args, model_config = parse_export(config)
    if args.variant is not None:  # its base, with its delta applied or its LoRA adapter merged
        files = variant_source(args.variant)
        model_config["model_name_or_path"], args.delta = files.base, files.delta
        if files.adapter is not None:
            model_config["adapter_name_or_path"] = files.adapter
    if args.export_format == "gguf":
        from gym.export.gguf import export_gguf

        return export_gguf(args, model_config)
    if args.export_format == "onnx":
        from gym.export.onnx import export_onnx

        return export_onnx(args, model_config)
    if args.export_format == "ollama":
        from gym.export.ollama import export_ollama

        return export_ollama(args, model_config)
    if args.export_format == "gguf-lora":
        from gym.export.gguf_lora import export_gguf_lora

        return export_gguf_lora(args, model_config)
    from gym.export.hf import export_hf

    return export_hf(args, model_config)
