"""One entry point for every export format, used by `gym export` and `Trainer.export`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gym.core.files import refuse_file_in_path, refuse_output_over_input, refuse_overwrite
from gym.core.names import split_names
from gym.export.config import ExportArguments, parse_export
from gym.personalization.store import variant_source


def run_export(config: dict[str, Any]) -> Path:
    """Export what `config` names (the model keys of `gym chat`, plus export_dir, export_format, ...)."""
    args, model_config = parse_export(config)
    if args.variant is not None:  # its base, with its delta applied or its LoRA adapter merged
        files = variant_source(args.variant)
        model_config["model_name_or_path"], args.delta = files.base, files.delta
        if files.adapter is not None:
            model_config["adapter_name_or_path"] = files.adapter
    check_output(args, model_config)
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


def check_output(args: ExportArguments, model_config: dict[str, Any]) -> None:
    """Refuse, before any model loads, an export_dir that is or holds one of the export's inputs (writing it would
    replace them), one under a file, and for the folder formats one that --overwrite may not replace."""
    assert args.export_dir is not None
    out = Path(args.export_dir)
    inputs = [model_config.get(key) for key in ("model_name_or_path", "model", "output_dir")]
    inputs += split_names(model_config.get("adapter_name_or_path"))
    inputs += [args.delta, args.variant.rpartition(":")[0] if args.variant else None]
    refuse_output_over_input(out, [str(ref) for ref in inputs if isinstance(ref, (str, Path)) and ref])
    if args.export_format in ("hf", "onnx"):
        refuse_overwrite(out, args.export_overwrite, folder=True)
    else:  # a .gguf file, or a folder the file is written in
        refuse_file_in_path(out, folder=out.suffix != ".gguf")
