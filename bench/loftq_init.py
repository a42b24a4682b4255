"""LoftQ's start on the embedded model: the top-r part of each weight's 4-bit rounding residual by the full SVD
(the baseline, what gym.models.loftq computed before) and by the seeded randomized SVD it uses now, on the same
residuals in one run.

For each of the model's LoRA-targeted matrices (lora_target all, NF4 with double quantization, as
examples/qlora_sft.yaml), both methods run on the same residual, each timed on its own; the table gives their
total time and the share of the rounding error's energy (squared Frobenius norm) each rank-r part removes, and
the randomized one's share relative to the exact one's (the worst matrix, and all of them together).

    HF_HUB_OFFLINE=1 .venv/bin/python bench/loftq_init.py [--rank 16] [--threads 1]
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the suite's workers use 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import bitsandbytes as bnb
    from peft.tuners.lora.bnb import Linear4bit
    from safetensors import safe_open

    from gym.config.parser import get_train_args
    from gym.models.adapters import setup_finetuning
    from gym.models.loader import load_causal_lm, resolve_model_path
    from gym.models.loftq import PEFT_PREFIX, original_weights, top_singular

    path = str(resolve_model_path("smollm2-135m"))
    train_args = get_train_args({"model_name_or_path": path, "quantization_bit": 4, "quantization_type": "nf4",
                                 "double_quantization": True, "lora_rank": args.rank, "lora_target": "all"})
    model = setup_finetuning(load_causal_lm(path, train_args.model), train_args.finetuning)
    files = original_weights(path)
    seconds = {"full SVD": 0.0, "randomized SVD": 0.0}
    energy = {"rounding error": 0.0, "full SVD": 0.0, "randomized SVD": 0.0}
    worst, matrices = 1.0, 0
    with torch.no_grad():
        for name, module in model.named_modules():
            if not isinstance(module, Linear4bit):
                continue
            key = name.removeprefix(PEFT_PREFIX) + ".weight"
            with safe_open(files[key], framework="pt") as handle:
                original = handle.get_tensor(key).float()
            weight = module.get_base_layer().weight
            residual = original - bnb.functional.dequantize_4bit(weight.data, weight.quant_state).float().cpu()
            started = time.perf_counter()
            u, s, vh = torch.linalg.svd(residual, full_matrices=False)
            seconds["full SVD"] += time.perf_counter() - started
            exact = (u[:, :args.rank] * s[:args.rank]) @ vh[:args.rank]
            started = time.perf_counter()
            ru, rs, rvh = top_singular(residual, args.rank)
            seconds["randomized SVD"] += time.perf_counter() - started
            total = float(residual.norm() ** 2)
            removed_exact = total - float((residual - exact).norm() ** 2)
            removed_randomized = total - float((residual - (ru * rs) @ rvh).norm() ** 2)
            energy["rounding error"] += total
            energy["full SVD"] += removed_exact
            energy["randomized SVD"] += removed_randomized
            worst = min(worst, removed_randomized / removed_exact)
            matrices += 1

    print(f"LoftQ top-{args.rank} parts of the embedded SmolLM2-135M's {matrices} NF4 rounding residuals, "
          f"{torch.get_num_threads()} thread(s)\n")
    print("| method | seconds | rounding error's energy removed | of the full SVD's |")
    print("|---|---:|---:|---:|")
    for method in ("full SVD", "randomized SVD"):
        share = energy[method] / energy["rounding error"]
        relative = energy[method] / energy["full SVD"]
        print(f"| {method} | {seconds[method]:.2f} | {share:.2%} | {relative:.2%} |")
    print(f"\nrandomized / full time: {seconds['randomized SVD'] / seconds['full SVD']:.2f}x; "
          f"worst matrix: {worst:.2%} of its full SVD's removed energy")


if __name__ == "__main__":
    main()
