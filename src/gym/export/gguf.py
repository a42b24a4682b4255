"""`gym export --format gguf --type T`: the merged model as one GGUF file for llama.cpp and Ollama.

The model is merged as for `--format hf` (gym.export.hf.load_merged), its tokenizer saved with the trained
chat template, then written by gym.export.gguf_file under a temporary name in export_dir and renamed to
`<name>-<QUANT>.gguf` (or to export_dir itself when it ends in .gguf), after a check of free space.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from gym.core.files import check_free_space, make_folder, refuse_overwrite, remove_stale_temps, temp_path
from gym.data.chat_jinja import jinja_chat_template
from gym.export.config import ExportArguments
from gym.export.gguf_file import write_gguf
from gym.export.hf import load_merged
from gym.export.spelling import option


def gguf_path(export_dir: str, name: str, gguf_type: str) -> Path:
    target = Path(export_dir)
    return target if target.suffix == ".gguf" else target / f"{name}-{gguf_type.upper()}.gguf"


def export_gguf(args: ExportArguments, config: dict[str, Any]) -> Path:
    return write_model_gguf(args, config)[0]


def write_model_gguf(args: ExportArguments, config: dict[str, Any]) -> tuple[Path, Any, dict[str, Any]]:
    """(the GGUF written, the chat format it carries, the decoding settings training saved)."""
    assert args.export_dir is not None
    bitdelta = args.export_type == "bitdelta"
    gguf_type = "f16" if bitdelta or not args.export_type else args.export_type
    merged = load_merged(config, args.delta, bitdelta)
    model, tokenizer, chat, decoding, model_path = (merged.model, merged.tokenizer, merged.chat, merged.decoding,
                                                    merged.model_path)
    # named after what the user named (`--model saves/run` is a run, though the weights come from its base)
    named = next((config[key] for key in ("adapter_name_or_path", "output_dir", "model_name_or_path", "model")
                  if config.get(key)), model_path)
    name = Path(str(named).split(",")[0].rstrip("/")).name
    out = gguf_path(args.export_dir, name, "bitdelta-f16" if bitdelta else gguf_type)
    refuse_overwrite(out, args.export_overwrite, option("export_overwrite", True))
    make_folder(out.parent)
    remove_stale_temps(out.parent)
    # The largest case is F32: 4 bytes a weight, plus the tokenizer.
    check_free_space(out, sum(p.numel() for p in model.parameters()) * (4 if gguf_type == "f32" else 2))
    if chat.template is not None:
        tokenizer.chat_template = jinja_chat_template(chat.template, tokenizer.eos_token or "", chat.default_system,
                                                      chat.enable_thinking, chat.tool_format)
    tmp = temp_path(out)
    try:
        with tempfile.TemporaryDirectory() as tokenizer_dir:
            tokenizer.save_pretrained(tokenizer_dir)
            write_gguf(model, tokenizer, Path(tokenizer_dir), tmp, gguf_type, name)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out, chat, decoding
