"""LLaMA-Factory keys Gym knows but does not run, each with the reason and what to do instead.

A config carrying one fails at parse time with that reason, not with "unknown key": the user learns that
the key was understood, and why it cannot work here. tests/config/test_llamafactory_parity.py runs
LLaMA-Factory-shaped fixtures through the parser to keep this list honest.
"""

from __future__ import annotations

_FSDP_WRAP = ("FSDP wraps each decoder layer by default; to choose the classes, set fsdp_config: "
              "{transformer_layer_cls_to_wrap: [LlamaDecoderLayer]} (docs/distributed.md).")


UNSUPPORTED: dict[str, str] = {
    "use_asft_loss": "Anchored SFT (DFT plus a KL anchor to the reference) is not implemented; use_dft_loss is.",
    "asft_alpha": "Anchored SFT is not implemented (asft_alpha is its KL weight); use_dft_loss is.",
    "use_eaft_loss": "LLaMA-Factory's EAFT loss is not implemented in Gym; use_dft_loss is the closest.",
    "fp8": "FP8 training needs a Hopper-or-newer CUDA GPU with torchao/Transformer Engine; Gym does not offer it yet.",
    "fp8_backend": "FP8 training is not offered yet (see fp8).",
    "fp8_enable_fsdp_float8_all_gather": "FP8 training with FSDP is not offered yet (see fp8).",
    "fsdp_transformer_layer_cls_to_wrap": _FSDP_WRAP,
    "mixture_of_depths": "Mixture-of-Depths conversion relies on a package that patches transformers 4 models; "
                         "it does not run with transformers 5.",
    "predict_with_generate": "Gym predicts with `gym infer CONFIG --dataset D -o out.jsonl`, not inside training.",
    "tokenized_path": "Gym keeps no tokenized copy of a dataset (tokenizing is fast next to training); remove it.",
}

# Keys Gym runs, but not inside a training config parsed from Python: another entry point reads them.
_RAY = ("is read when Ray runs the training: `USE_RAY=1 gym train CONFIG` (pip install 'zoo-gym[ray]'; "
        "docs/distributed.md), not by a run started from Python.")
READ_ELSEWHERE: dict[str, str] = {key: _RAY for key in ("ray_num_workers", "resources_per_worker",
                                                        "placement_strategy", "ray_run_name", "ray_storage_path",
                                                        "ray_init_kwargs")}

_NEW_TOKENS = ("Gym does not add tokens to a tokenizer (nor rows to the embeddings) yet: it trains with the "
               "vocabulary the model ships with, and its templates use the model's own special tokens.")

# LLaMA-Factory keys Gym runs one way only: (the value Gym always runs with, why the other cannot run). That value
# is accepted (it is what happens), so a pasted config that spells out the default still runs; the other is
# refused with the reason rather than ignored. A list or text value counts as its truth: empty is off.
ONE_WAY: dict[str, tuple[bool, str]] = {
    "low_cpu_mem_usage": (True, "transformers 5 always loads weights straight into place (no random init first); "
                                "there is no other way to load. Remove it."),
    "resize_vocab": (False, _NEW_TOKENS),
    "new_special_tokens": (False, _NEW_TOKENS),
    "add_tokens": (False, _NEW_TOKENS),
    "add_special_tokens": (False, _NEW_TOKENS),
    "split_special_tokens": (False, "Gym's chat templates write special tokens as text and need the tokenizer to "
                                    "read each as one token; splitting them would change every template's prompt."),
    "compute_accuracy": (False, "token accuracy at evaluation is not computed; evaluation reports eval_loss, and "
                                "`gym eval` scores tasks (eval_tasks) with accuracies."),
    "create_new_adapter": (False, "with adapter_name_or_path, Gym merges all but the last adapter and continues "
                                  "training the last; for a new adapter on top, merge them first (`gym export`) and "
                                  "train on the merged model."),
}


def is_on(value: object) -> bool:
    """A LLaMA-Factory switch's truth, as YAML or a command-line override writes it (text: off, false, no, 0,
    none or empty is off)."""
    if isinstance(value, str):
        return value.strip().lower() not in ("", "false", "no", "off", "0", "none", "null")
    return bool(value)
