"""One entry point for every export format, used by `gym export` and `Trainer.export`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gym.core.errors import ConfigError
from gym.core.files import refuse_file_in_path, refuse_output_over_input, refuse_overwrite
from gym.core.names import split_names
from gym.export.config import ExportArguments, parse_export
from gym.export.spelling import CLI, Spelling, option, spelled
from gym.personalization.store import variant_source


def run_export(config: dict[str, Any], spelling: Spelling = CLI) -> Path:
    """Export what `config` names (the model keys of `gym chat`, plus export_dir, export_format, ...). `spelling`:
    how the caller's door writes the export's options, which every error names as it does."""
    with spelled(spelling):
        return _export(config)


def _export(config: dict[str, Any]) -> Path:
    args, model_config = parse_export(config)
    if args.variant is not None:  # its base, with its delta applied or its LoRA adapter merged
        files = variant_source(args.variant)
        model_config["model_name_or_path"], args.delta = files.base, files.delta
        if files.adapter is not None:
            model_config["adapter_name_or_path"] = files.adapter
    check_output(args, model_config)
    refuse_unexportable(args, model_config)
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
    how = option("export_overwrite", True)
    refuse_output_over_input(out, [str(ref) for ref in inputs if isinstance(ref, (str, Path)) and ref], how)
    if args.export_format in ("hf", "onnx"):
        refuse_overwrite(out, args.export_overwrite, how, folder=True)
    else:  # a .gguf file, or a folder the file is written in
        refuse_file_in_path(out, folder=out.suffix != ".gguf")


# What each format would need for a vision-language model, and why Gym does not write it.
_MULTIMODAL_GAPS = {
    "gguf": "llama.cpp runs one as two GGUF files, the language model plus an mmproj file holding the vision tower "
            "and projector, and Gym writes neither for a vision-language model",
    "ollama": "Ollama imports one from two GGUF files, the language model plus an mmproj file holding the vision "
              "tower and projector, and Gym writes neither for a vision-language model",
    "gguf-lora": "a GGUF LoRA adapter applies to the language model's GGUF, which llama.cpp pairs with an mmproj "
                 "file for the vision tower and projector; Gym writes neither for a vision-language model",
    "onnx": "Gym's ONNX export is a text decoder (token ids in, logits out) with no input for the images the vision "
            "tower and projector read",
}


def refuse_unexportable(args: ExportArguments, model_config: dict[str, Any]) -> None:
    """What the format cannot hold, refused from the model's config before any weight loads (minutes for a 7B
    model), with what it would need and the way that works: a vision-language model exports as an hf folder only
    (with its processor), and a GGUF holds only the architectures gym.export.gguf_file writes."""
    if args.export_format == "hf" and not args.delta and args.export_type != "bitdelta":
        return
    from gym.infer.config import resolve_inference_config
    from gym.models.loader import resolve_model_path
    from gym.models.vision import is_multimodal, model_type_of

    reference = resolve_inference_config(dict(model_config)).get("model_name_or_path")
    if not isinstance(reference, str):
        return
    path = resolve_model_path(reference)
    if not is_multimodal(path):
        model_type = model_type_of(path)
        if args.export_format in ("gguf", "ollama") and model_type is not None:  # gguf-lora checks it before loading
            from gym.export.gguf_file import arch_for

            arch_for(model_type)
        return
    if args.export_format == "hf":
        raise ConfigError(f"{reference} is a vision-language model, and delta files and BitDelta variants are made "
                          f"for text models: export it without {option('delta')} / "
                          f"{option('export_type', 'bitdelta')} (its adapter merged).")
    raise ConfigError(
        f"{reference} is a vision-language model, so {option('export_format', args.export_format)} cannot hold it: "
        f"{_MULTIMODAL_GAPS[args.export_format]}. Export with {option('export_format', 'hf')} instead (the merged "
        "model with its processor, "
        "for transformers and vLLM); for llama.cpp, convert that folder with llama.cpp's convert_hf_to_gguf.py, once "
        "for the language model and once with --mmproj for the vision part.")
