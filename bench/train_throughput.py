"""SFT-LoRA throughput: Gym's defaults against plain TRL `SFTTrainer` with its defaults, in one run.

Same model (the embedded SmolLM2-135M-Instruct), same rows (~240-token multi-turn conversations
built from data/alpaca_en_demo.json), same LoRA (r=8, alpha=16, all linear layers), same batch
size, learning rate, seed and number of steps. The baseline is TRL in float32 with every other
default (gradient checkpointing included); TRL with its real default, bf16=True, is measured too.
Gym rows vary one default at a time so each choice's share of the gain is visible.
Each configuration runs in its own process so that peak memory is its own.

Tokens/s = non-padding tokens fed to the model / wall time of `trainer.train()`.

    python bench/train_throughput.py [--steps 8] [--batch 4]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LORA = dict(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear")


def build_rows(path: Path, target_tokens: int = 240) -> dict:
    """Multi-turn conversations of about `target_tokens` tokens, from the alpaca demo rows."""
    from gym.models.loader import load_tokenizer, resolve_model_path

    tokenizer = load_tokenizer(resolve_model_path(None))
    source = json.loads((REPO / "data" / "alpaca_en_demo.json").read_text())
    rows, messages = [], []
    for item in source:
        question = "\n".join(p for p in (item["instruction"], item["input"]) if p)
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": item["output"]}]
        if len(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]) >= target_tokens:
            rows.append({"messages": messages})
            messages = []
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    lengths = [len(tokenizer.apply_chat_template(r["messages"], tokenize=True, return_dict=True)["input_ids"])
               for r in rows]
    return {"rows": len(rows), "mean_tokens": sum(lengths) / len(lengths)}


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def run_trl(data: Path, steps: int, batch: int, out: str, bf16: bool = False) -> dict:
    import torch
    from datasets import load_dataset
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    from gym.models.loader import resolve_model_path

    model_path = resolve_model_path(None)
    dataset = load_dataset("json", data_files=str(data), split="train")
    config = SFTConfig(output_dir=out, per_device_train_batch_size=batch, max_steps=steps, learning_rate=2e-4,
                       bf16=bf16, seed=42, logging_steps=1, save_strategy="no", report_to="none", use_cpu=True,
                       disable_tqdm=True)
    trainer = SFTTrainer(model=model_path, args=config, train_dataset=dataset, peft_config=LoraConfig(**LORA))
    seen = {"tokens": 0}
    collate = trainer.data_collator

    def counting(features):
        batch_ = collate(features)
        mask = batch_.get("attention_mask")
        seen["tokens"] += int(mask.sum()) if mask is not None else batch_["input_ids"].numel()
        return batch_

    trainer.data_collator = counting
    torch.manual_seed(42)
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    return {"tokens": seen["tokens"], "seconds": seconds, "final_loss": losses[-1]}


def run_gym(data: Path, steps: int, batch: int, out: str, **extra) -> dict:
    from gym.workflows.training import run_exp

    config = {"stage": "sft", "finetuning_type": "lora", "dataset": str(data), "cutoff_len": 1024,
              "lora_rank": LORA["r"], "lora_alpha": LORA["lora_alpha"], "per_device_train_batch_size": batch,
              "max_steps": steps, "learning_rate": 2e-4, "seed": 42, "save_strategy": "no", "output_dir": out,
              "disable_tqdm": True, **extra}
    result = run_exp(config)
    return {"tokens": result.tokens_seen, "seconds": result.train_seconds, "final_loss": result.final_loss}


CONFIGS = {
    "trl (defaults, fp32)": lambda d, s, b, o: run_trl(d, s, b, o),
    "trl (bf16=True, its real default)": lambda d, s, b, o: run_trl(d, s, b, o, bf16=True),
    "gym (defaults)": lambda d, s, b, o: run_gym(d, s, b, o),
    "gym (float32, like the baseline)": lambda d, s, b, o: run_gym(d, s, b, o, bf16=False),
    "gym (loss on all tokens, like trl)": lambda d, s, b, o: run_gym(d, s, b, o, train_on_prompt=True),
    "gym (gradient checkpointing on)": lambda d, s, b, o: run_gym(d, s, b, o, gradient_checkpointing=True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--only", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    if args.only:  # child process: one configuration, one JSON line
        import logging

        logging.disable(logging.WARNING)
        with tempfile.TemporaryDirectory() as out:
            result = CONFIGS[args.only](Path(args.data), args.steps, args.batch, out)
        result["peak_gib"] = peak_rss_gib()
        print("RESULT " + json.dumps(result))
        return

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "rows.jsonl"
        info = build_rows(data)
        print(f"data: {info['rows']} conversations, {info['mean_tokens']:.0f} tokens on average; "
              f"{args.steps} steps of batch {args.batch}; torch threads: {os.cpu_count()} cores")
        results = {}
        for name in CONFIGS:
            proc = subprocess.run([sys.executable, __file__, "--only", name, "--data", str(data), "--steps",
                                   str(args.steps), "--batch", str(args.batch)], capture_output=True, text=True)
            line = next((out for out in proc.stdout.splitlines() if out.startswith("RESULT ")), None)
            if line is None:
                print(f"{name} failed:\n{proc.stderr[-3000:]}")
                continue
            results[name] = json.loads(line[len("RESULT "):])
    baseline = results.get("trl (defaults, fp32)")
    from gym.core.hardware import native_bf16

    print(f"native bf16 on this machine: {native_bf16()}")
    print("\n| configuration | tokens | seconds | tokens/s | vs TRL fp32 | peak RSS (GiB) | last loss |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        rate = r["tokens"] / r["seconds"]
        ratio = rate / (baseline["tokens"] / baseline["seconds"]) if baseline else float("nan")
        print(f"| {name} | {r['tokens']} | {r['seconds']:.1f} | {rate:.1f} | {ratio:.2f}x | {r['peak_gib']:.2f} "
              f"| {r['final_loss']:.3f} |")


if __name__ == "__main__":
    main()
