"""`gym export CONFIG [--export_dir DIR] [--format hf] [--export_dtype D] [--export_size GB] [--overwrite]`."""

from __future__ import annotations

from gym.config.files import parse_cli_args
from gym.export.config import parse_export

USAGE = """usage: gym export CONFIG [--export_dir DIR] [--format hf] [--export_dtype auto|float32|float16|bfloat16]
                  [--export_size GB] [--delta FILE] [--overwrite] [key=value ...]

CONFIG names the model as `gym chat` does (model_name_or_path, adapter_name_or_path, or a training config whose
output_dir holds the run). --format hf: the adapters merged into the base, safetensors shards, the tokenizer with
the trained chat template, generation_config.json. See docs/export.md."""


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    args, config = parse_export(parse_cli_args(argv))
    if args.export_format == "gguf":
        from gym.export.gguf import export_gguf

        out = export_gguf(args, config)
    else:
        from gym.export.hf import export_hf

        out = export_hf(args, config)
    print(f"Exported {out}")
    return 0
