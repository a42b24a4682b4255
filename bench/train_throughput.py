"""SFT-LoRA throughput: Gym's defaults against plain TRL `SFTTrainer` with its defaults, in one run.

Same model (the embedded SmolLM2-135M-Instruct), same rows (~240-token multi-turn conversations
built from data/alpaca_en_demo.json), same LoRA (r=8, alpha=16, all linear layers), same batch
size, learning rate, seed and number of steps. The baseline is TRL in float32 with every other
default (gradient checkpointing included); TRL with its real default, bf16=True, is measured too.
Gym rows vary one default at a time so each choice's share of the gain is visible.
Each configuration runs in its own process so that peak memory is its own.

Tokens/s = non-padding tokens fed to the model / wall time of `trainer.train()`. "Steady tokens/s" leaves
out the first `--warmup` steps (Triton's and CUDA's one-time compiles, the allocator's first growth), which a
40-step run on a GPU otherwise pays as a large share of its time, and a long fine-tune does not. Each
configuration gets its own empty Triton cache, so no row inherits kernels another compiled.

    python bench/train_throughput.py [--steps 8] [--batch 4]

On a CUDA GPU (issue #43) the model is a Qwen3-0.6B-sized one built from its config (random weights: speed does
not depend on their values) with the embedded tokenizer, the rows are ~1,024 tokens, and the baseline is TRL
with its real defaults there (bf16, gradient checkpointing). Liger's kernels and flash-attn are measured where
they are installed, for both tools:

    python bench/train_throughput.py --model qwen3-0.6b --row-tokens 1024 --batch 8 --steps 40
    python bench/train_throughput.py --model qwen3-0.6b --tiny --steps 2   # checks the script on any machine

`--tokenizer DIR` names a tokenizer folder where the embedded model is not installed (a GPU machine).
"""

from __future__ import annotations

import argparse
import importlib.util
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
# Qwen3-0.6B's published config (as bench/gpu_speed.py builds it); --tiny shrinks it to check the script.
QWEN3_06B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                 rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)
TINY = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=4096, tie_word_embeddings=True)


def tokenizer_dir(explicit: str | None) -> str:
    from gym.models.loader import resolve_model_path

    return explicit or str(resolve_model_path(None))


def build_model(folder: Path, tokenizer_path: str, tiny: bool) -> str:
    """A Qwen3-0.6B-sized model from its config, saved in bf16 beside the tokenizer it will train with."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    shape = TINY if tiny else QWEN3_06B
    # The tokenizer's ids must be rows of the embedding: the embedded one has 49,152, Qwen3 151,936.
    assert len(tokenizer) <= shape["vocab_size"], (len(tokenizer), shape["vocab_size"])
    config = Qwen3Config(**shape, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, dtype="bfloat16")
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def build_rows(path: Path, tokenizer_path: str, target_tokens: int = 240) -> dict:
    """Multi-turn conversations of about `target_tokens` tokens, from the alpaca demo rows."""
    from gym.models.loader import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_path)
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


def on_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def clock_steps() -> list[tuple[float, int]]:
    """Patch `Trainer.training_step` (TRL's and Gym's trainers both inherit it) to record, after each step's
    backward, the time (the GPU synchronised) and the non-padding tokens the step was fed."""
    import torch
    from transformers import Trainer

    marks: list[tuple[float, int]] = []
    original = Trainer.training_step

    def step_tokens(inputs: dict) -> int:
        if "num_tokens" in inputs:  # Gym's collator counts them
            return int(inputs["num_tokens"])
        mask = inputs.get("attention_mask")
        return int(mask.sum()) if mask is not None else int(inputs["input_ids"].numel())

    def training_step(self, model, inputs, *args, **kwargs):
        tokens = step_tokens(inputs)
        loss = original(self, model, inputs, *args, **kwargs)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        marks.append((time.perf_counter(), tokens))
        return loss

    Trainer.training_step = training_step
    return marks


def steady(marks: list[tuple[float, int]], warmup: int) -> dict:
    """Tokens and seconds of the steps after the first `warmup` (from the end of step `warmup` on)."""
    warmup = max(warmup, 1)  # the clock starts at the end of a step
    if len(marks) <= warmup:
        return {}
    return {"steady_tokens": sum(tokens for _, tokens in marks[warmup:]),
            "steady_seconds": marks[-1][0] - marks[warmup - 1][0]}


def run_trl(model_path: str, data: Path, steps: int, batch: int, out: str, bf16: bool = False, **extra) -> dict:
    import torch
    from datasets import load_dataset
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    dataset = load_dataset("json", data_files=str(data), split="train")
    config = SFTConfig(output_dir=out, per_device_train_batch_size=batch, max_steps=steps, learning_rate=2e-4,
                       bf16=bf16, seed=42, logging_steps=1, save_strategy="no", report_to="none",
                       use_cpu=not on_gpu(), disable_tqdm=True, **extra)
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


def run_gym(model_path: str, data: Path, steps: int, batch: int, out: str, **extra) -> dict:
    from gym.workflows.training import run_exp

    config = {"stage": "sft", "model_name_or_path": model_path, "finetuning_type": "lora", "dataset": str(data),
              "cutoff_len": 1024,
              "lora_rank": LORA["r"], "lora_alpha": LORA["lora_alpha"], "per_device_train_batch_size": batch,
              "max_steps": steps, "learning_rate": 2e-4, "seed": 42, "save_strategy": "no", "output_dir": out,
              "disable_tqdm": True, **extra}
    result = run_exp(config)
    return {"tokens": result.tokens_seen, "seconds": result.train_seconds, "final_loss": result.final_loss}


CPU_CONFIGS = {
    "trl (defaults, fp32)": lambda *a: run_trl(*a),
    "trl (bf16=True, its real default)": lambda *a: run_trl(*a, bf16=True),
    "gym (defaults)": lambda *a: run_gym(*a),
    "gym (float32, like the baseline)": lambda *a: run_gym(*a, bf16=False),
    "gym (loss on all tokens, like trl)": lambda *a: run_gym(*a, train_on_prompt=True),
    "gym (gradient checkpointing on)": lambda *a: run_gym(*a, gradient_checkpointing=True),
}
# On a GPU TRL's real defaults are the baseline: bf16 and gradient checkpointing on.
GPU_CONFIGS = {
    "trl (defaults)": lambda *a: run_trl(*a, bf16=True),
    "gym (defaults)": lambda *a: run_gym(*a),
    "gym (loss on all tokens, like trl)": lambda *a: run_gym(*a, train_on_prompt=True),
    "gym (gradient checkpointing on, like trl)": lambda *a: run_gym(*a, gradient_checkpointing=True),
}
LIGER_CONFIGS = {
    "trl (defaults + liger)": lambda *a: run_trl(*a, bf16=True, use_liger_kernel=True),
    "gym (defaults + liger)": lambda *a: run_gym(*a, use_liger_kernel=True),
    # The low-memory setting: both of TRL's memory savers on.
    "gym (gradient checkpointing on + liger)": lambda *a: run_gym(*a, gradient_checkpointing=True,
                                                                   use_liger_kernel=True),
}
FLASH_CONFIGS = {
    "trl (defaults + flash-attn 2)": lambda *a: run_trl(*a, bf16=True,
                                                        model_init_kwargs={"attn_implementation": "flash_attention_2"}),
    "gym (defaults + flash-attn 2)": lambda *a: run_gym(*a, flash_attn="fa2"),
}


def configs() -> dict:
    if not on_gpu():
        return CPU_CONFIGS
    chosen = dict(GPU_CONFIGS)
    if importlib.util.find_spec("liger_kernel") is not None:
        chosen.update(LIGER_CONFIGS)
    if importlib.util.find_spec("flash_attn") is not None:
        chosen.update(FLASH_CONFIGS)
    return chosen


def peak_memory() -> tuple[str, float]:
    import torch

    if torch.cuda.is_available():
        return "peak GPU memory (GiB)", torch.cuda.max_memory_allocated() / 2**30
    return "peak RSS (GiB)", peak_rss_gib()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--model", choices=["smollm2", "qwen3-0.6b"], default="smollm2",
                        help="the embedded SmolLM2-135M, or a Qwen3-0.6B-sized model built from its config")
    parser.add_argument("--tokenizer", help="tokenizer folder (default: the embedded model's)")
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the steady rate")
    parser.add_argument("--row-tokens", type=int, default=240, help="tokens per conversation, about")
    parser.add_argument("--tiny", action="store_true", help="with --model qwen3-0.6b: 2 layers, to check the script")
    parser.add_argument("--configs", help="';'-separated configurations to run (default: all; the first is the "
                        "baseline)")
    parser.add_argument("--only", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--model-path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    if args.only:  # child process: one configuration, one JSON line
        import logging

        logging.disable(logging.WARNING)
        marks = clock_steps()
        with tempfile.TemporaryDirectory() as out:
            result = configs()[args.only](args.model_path, Path(args.data), args.steps, args.batch, out)
        result.update(steady(marks, args.warmup))
        result["memory_label"], result["peak_gib"] = peak_memory()
        print("RESULT " + json.dumps(result))
        return

    import torch

    tokenizer = tokenizer_dir(args.tokenizer)
    with tempfile.TemporaryDirectory() as tmp:
        model_path = tokenizer if args.model == "smollm2" else build_model(Path(tmp) / "model", tokenizer, args.tiny)
        data = Path(tmp) / "rows.jsonl"
        info = build_rows(data, tokenizer, args.row_tokens)
        where = (f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}" if on_gpu()
                 else f"CPU: {os.cpu_count()} cores, torch {torch.__version__}")
        print(f"model: {args.model}{' (tiny)' if args.tiny else ''}; data: {info['rows']} conversations, "
              f"{info['mean_tokens']:.0f} tokens on average; {args.steps} steps of batch {args.batch}; {where}")
        results = {}
        chosen = [name.strip() for name in args.configs.split(";")] if args.configs else list(configs())
        unknown = [name for name in chosen if name not in configs()]
        if unknown:
            sys.exit(f"unknown configuration {unknown[0]!r}; here: {'; '.join(configs())}")
        for index, name in enumerate(chosen):
            env = {**os.environ, "TRITON_CACHE_DIR": str(Path(tmp) / f"triton-{index}")}
            proc = subprocess.run([sys.executable, __file__, "--only", name, "--data", str(data), "--model-path",
                                   model_path, "--steps", str(args.steps), "--batch", str(args.batch),
                                   "--warmup", str(args.warmup)], capture_output=True, text=True, env=env)
            line = next((out for out in proc.stdout.splitlines() if out.startswith("RESULT ")), None)
            if line is None:
                print(f"{name} failed:\n{proc.stderr[-3000:]}", flush=True)
                continue
            results[name] = json.loads(line[len("RESULT "):])
            print(f"{name}: {results[name]}", flush=True)
    baseline_name = chosen[0]
    baseline = results.get(baseline_name)
    from gym.core.hardware import native_bf16

    if not on_gpu():
        print(f"native bf16 on this machine: {native_bf16()}")
    label = next(iter(results.values()))["memory_label"] if results else "peak memory (GiB)"
    def steady_rate(r: dict) -> float:
        return r["steady_tokens"] / r["steady_seconds"] if r.get("steady_seconds") else float("nan")

    print(f"\n| configuration | tokens | seconds | tokens/s | vs {baseline_name} | steady tokens/s (after "
          f"{args.warmup} steps) | vs {baseline_name} | {label} | last loss |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        rate = r["tokens"] / r["seconds"]
        ratio = rate / (baseline["tokens"] / baseline["seconds"]) if baseline else float("nan")
        steady_ratio = steady_rate(r) / steady_rate(baseline) if baseline else float("nan")
        print(f"| {name} | {r['tokens']} | {r['seconds']:.1f} | {rate:.1f} | {ratio:.2f}x | {steady_rate(r):.1f} "
              f"| {steady_ratio:.2f}x | {r['peak_gib']:.2f} | {r['final_loss']:.3f} |")


if __name__ == "__main__":
    main()
