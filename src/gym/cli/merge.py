"""`gym merge CONFIG [key=value ...]`: several LoRA adapters or full fine-tunes of one base -> one model folder."""

from __future__ import annotations

from gym.config.files import parse_cli_args

USAGE = """usage: gym merge CONFIG [key=value ...] [--overwrite]

Merges LoRA adapters or full fine-tunes of ONE base model into one model folder (safetensors, config, tokenizer)
that transformers, `gym chat` and `gym export` load as model_name_or_path. CONFIG is mergekit-shaped YAML:

  merge_method: ties            # linear | task_arithmetic | ties | dare (dare_linear) | dare_ties
  base_model: smollm2-135m      # what the fine-tunes started from (optional for linear over full models)
  models:
    - model: saves/a            # a full fine-tune folder, or a LoRA adapter folder
      parameters: {weight: 0.5, density: 0.6}
  parameters: {normalize: true} # also lambda, rescale, and default weight / density
  dtype: auto                   # auto | float32 | float16 | bfloat16
  output_dir: merged/
  seed: 0                       # dare: the drop masks
  overwrite: false

key=value overrides any top-level key (output_dir=x, merge_method=linear, parameters.normalize=false).
See docs/merge.md."""


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    from gym.merge.run import merge_models  # torch and transformers load only for a real merge

    out = merge_models(parse_cli_args(argv))
    print(f"Merged into {out}")
    return 0
