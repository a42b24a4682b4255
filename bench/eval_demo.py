"""The embedded model, its demo fine-tune and that fine-tune's BitDelta, side by side on `gym eval`'s demo tasks.

Runs, as a user would:
    gym train   LoRA SFT of the embedded model on mc_demo_train (the answer letters of mc_demo's train split)
    gym delta compress --base smollm2-135m --finetuned <the adapter> --method bitdelta
                --eval-task mc_demo --eval-task arithmetic --eval-limit N
which scores the base (the baseline, measured in the same run), the fine-tune and the compressed fine-tune
on the multiple-choice demo (the first N held-out questions of each of its 5 subjects, 5-shot, chat
format) and on the arithmetic generation task (greedy, the first N problems, checked final number), and
prints the table.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/eval_demo.py [--epochs 3] [--eval-limit 30] [--keep DIR]
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=float, default=3)
    parser.add_argument("--eval-limit", type=int, default=30, help="items per mc subject / arithmetic problems")
    parser.add_argument("--keep", help="write the run here (default: a temporary folder)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="[gym] %(message)s")
    from gym.cli import main as gym

    work = Path(args.keep or tempfile.mkdtemp(prefix="gym-eval-bench-"))
    adapter, delta = work / "mc_lora", work / "mc_bitdelta.safetensors"
    started = time.time()
    if not (adapter / "gym_manifest.json").is_file():
        status = gym(["train", "model_name_or_path=smollm2-135m", "stage=sft", "finetuning_type=lora", "lora_rank=16",
                      "lora_target=all", "dataset=mc_demo_train", f"dataset_dir={REPO / 'data'}", "cutoff_len=512",
                      "per_device_train_batch_size=8", "learning_rate=5e-4", f"num_train_epochs={args.epochs}",
                      "lr_scheduler_type=cosine", "warmup_ratio=0.05", "logging_steps=10", "save_steps=100000",
                      "report_to=none", f"output_dir={adapter}", "seed=0"])
        if status:
            raise SystemExit(status)
    trained = time.time()
    status = gym(["delta", "compress", "--base", "smollm2-135m", "--finetuned", str(adapter), "--method", "bitdelta",
                  "--calibration", "mc_demo_train", "--dataset-dir", str(REPO / "data"), "--distill-steps", "100",
                  "-o", str(delta), "--overwrite", "--eval-task", "mc_demo", "--eval-task", "arithmetic",
                  "--eval-limit", str(args.eval_limit)])
    print(f"\ntraining {trained - started:.0f} s, compression and evaluation {time.time() - trained:.0f} s "
          f"(outputs in {work})")
    raise SystemExit(status)


if __name__ == "__main__":
    main()
