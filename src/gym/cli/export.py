"""`gym export CONFIG --export_dir DIR [--format hf|gguf|gguf-lora|ollama|onnx] [--type T] [key=value ...]`."""

from __future__ import annotations

from gym.config.files import parse_cli_args
from gym.export.config import as_given
from gym.export.run import run_export
from gym.export.spelling import CLI

USAGE = """usage: gym export CONFIG --export_dir DIR [--format hf|gguf|gguf-lora|ollama|onnx] [--type T]
                  [--export_dtype auto|float32|float16|bfloat16] [--export_size GB] [--delta FILE] [--overwrite]

CONFIG names the model as `gym chat` does (a run or model folder, model_name_or_path, adapter_name_or_path, or a
training config whose output_dir holds the run). --format hf: the adapters merged into the base, safetensors shards,
the tokenizer with the trained chat template, generation_config.json; a vision-language model exports whole, with its
processor, and as hf only. --format gguf --type f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|q4_k_m|q5_k_m|q6_k: one file
for llama.cpp and Ollama. --format gguf-lora: the LoRA adapter as a GGUF adapter (llama.cpp --lora). --format
ollama: the GGUF and a Modelfile with the trained chat template. See docs/export.md."""


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    config = parse_cli_args(argv, model_folders=True)
    out = run_export(config, as_given(CLI, config))
    print(f"Exported {out}")
    return 0
