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
