"""DPO-LoRA and GRPO-LoRA seconds per step: Gym's defaults against plain TRL with its defaults, in one run.

Same model (the embedded SmolLM2-135M-Instruct), same rows, same LoRA (r=8, alpha=16, all linear
layers), batch size, learning rate, seed and number of steps.
- DPO: preference pairs from data/dpo_en_demo.json (conversational prompt/chosen/rejected for TRL,
  the dataset name for Gym), batch 4.
- GRPO: prompts from data/arithmetic_demo.json, 4 completions x 32 new tokens per step (batch 4,
  num_generations 4), the `format` reward for both.
The baseline is TRL in float32 with every other default (gradient checkpointing included); TRL with
bf16=True is measured too. Each configuration runs in its own process, so peak memory is its own.

Seconds per step = median time between consecutive optimizer steps, the first step left out
(it includes one-off warm-up).

    python bench/align_speed.py [--steps 6] [--only-method dpo|grpo]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LORA = dict(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear")
BATCH, LR, SEED = 4, 5e-5, 42


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def median_step_seconds(times: list[float]) -> float:
    gaps = [b - a for a, b in zip(times, times[1:])]
    return statistics.median(gaps) if gaps else float("nan")


def _trl_pairs(n: int) -> list[dict]:
    rows = json.loads((REPO / "data" / "dpo_en_demo.json").read_text())[:n]
    role = {"human": "user", "gpt": "assistant"}
    return [{"prompt": [{"role": role[m["from"]], "content": m["value"]} for m in r["conversations"]],
             "chosen": [{"role": "assistant", "content": r["chosen"]["value"]}],
             "rejected": [{"role": "assistant", "content": r["rejected"]["value"]}]} for r in rows]


def _trl_prompts(n: int) -> list[dict]:
    rows = json.loads((REPO / "data" / "arithmetic_demo.json").read_text())[:n]
    return [{"prompt": [{"role": "user", "content": r["instruction"]}], "answer": r["answer"]} for r in rows]


def _step_timer():
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_step_end(self, args, state, control, **kwargs):
            self.times.append(time.perf_counter())

    return StepTimer()


def run_trl(method: str, steps: int, out: str, bf16: bool = False) -> dict:
    from datasets import Dataset
    from peft import LoraConfig

    from gym.models.loader import resolve_model_path
    from gym.rewards.functions import get_reward_funcs

    model_path = resolve_model_path(None)
    common = dict(output_dir=out, per_device_train_batch_size=BATCH, max_steps=steps, learning_rate=LR, bf16=bf16,
                  seed=SEED, logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True)
    if method == "dpo":
        from trl import DPOConfig, DPOTrainer

        trainer = DPOTrainer(model=model_path, args=DPOConfig(**common),
                             train_dataset=Dataset.from_list(_trl_pairs(BATCH * steps)),
                             peft_config=LoraConfig(**LORA))
    else:
        from trl import GRPOConfig, GRPOTrainer

        funcs, _ = get_reward_funcs(["format"])
        trainer = GRPOTrainer(model=model_path, reward_funcs=funcs,
                              args=GRPOConfig(**common, num_generations=4, max_completion_length=32),
                              train_dataset=Dataset.from_list(_trl_prompts(steps)), peft_config=LoraConfig(**LORA))
    timer = _step_timer()
    trainer.add_callback(timer)
    started = time.perf_counter()
    trainer.train()
    return _summary(trainer.state.log_history, timer.times, time.perf_counter() - started)


def run_gym(method: str, steps: int, out: str, **extra) -> dict:
    from gym.train.harness import read_log
    from gym.workflows.training import run_exp

    config = {"stage": method, "finetuning_type": "lora", "lora_rank": LORA["r"], "lora_alpha": LORA["lora_alpha"],
              "per_device_train_batch_size": BATCH, "max_steps": steps, "learning_rate": LR, "seed": SEED,
              "save_strategy": "no", "output_dir": out, "disable_tqdm": True, "dataset_dir": str(REPO / "data")}
    if method == "dpo":
        config.update(dataset="dpo_en_demo", max_samples=BATCH * steps)
    else:
        config.update(dataset="arithmetic_demo", max_samples=steps, reward_funcs=["format"], num_generations=4,
                      max_completion_length=32)
    config.update(extra)
    started = time.perf_counter()
    run_exp(config)
    seconds = time.perf_counter() - started
    log = read_log(out)
    times = [e["elapsed_s"] for e in log if "loss" in e]
    return _summary(log, times, seconds)


def _summary(log: list[dict], times: list[float], seconds: float) -> dict:
    def last(key: str) -> float | None:
        values = [e[key] for e in log if key in e]
        return values[-1] if values else None

    return {"s_per_step": median_step_seconds(times), "seconds": seconds, "final_loss": last("loss"),
            "reward": last("reward")}


CONFIGS = {
    "dpo": {
        "trl DPO (defaults, fp32)": lambda s, o: run_trl("dpo", s, o),
        "trl DPO (bf16=True)": lambda s, o: run_trl("dpo", s, o, bf16=True),
        "gym dpo (defaults)": lambda s, o: run_gym("dpo", s, o),
        "gym dpo (float32, like the baseline)": lambda s, o: run_gym("dpo", s, o, bf16=False),
    },
    "grpo": {
        "trl GRPO (defaults, fp32)": lambda s, o: run_trl("grpo", s, o),
        "trl GRPO (bf16=True)": lambda s, o: run_trl("grpo", s, o, bf16=True),
        "gym grpo (defaults)": lambda s, o: run_gym("grpo", s, o),
        "gym grpo (float32, like the baseline)": lambda s, o: run_gym("grpo", s, o, bf16=False),
    },
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--only-method", choices=sorted(CONFIGS))
    parser.add_argument("--only", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    if args.only:  # child process: one configuration, one JSON line
        import logging

        logging.disable(logging.WARNING)
        method, name = args.only.split("/", 1)
        with tempfile.TemporaryDirectory() as out:
            result = CONFIGS[method][name](args.steps, out)
        result["peak_gib"] = peak_rss_gib()
        print("RESULT " + json.dumps(result))
        return

    from gym.core.hardware import native_bf16

    print(f"{args.steps} steps per configuration, batch {BATCH}, LoRA r={LORA['r']}; "
          f"{os.cpu_count()} cores; native bf16: {native_bf16()}")
    for method in [args.only_method] if args.only_method else list(CONFIGS):
        results = {}
        for name in CONFIGS[method]:
            proc = subprocess.run([sys.executable, __file__, "--only", f"{method}/{name}", "--steps", str(args.steps)],
                                  capture_output=True, text=True)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line is None:
                print(f"{name} failed:\n{proc.stderr[-3000:]}")
                continue
            results[name] = json.loads(line[len("RESULT "):])
        baseline = next(iter(results.values()), None) if results else None
        print(f"\n| {method} configuration | s/step (median) | vs TRL fp32 | total s | peak RSS (GiB) | last loss |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, r in results.items():
            speedup = baseline["s_per_step"] / r["s_per_step"] if baseline else float("nan")
            loss = f"{r['final_loss']:.3f}" if r["final_loss"] is not None else "n/a"
            print(f"| {name} | {r['s_per_step']:.2f} | {speedup:.2f}x | {r['seconds']:.0f} | {r['peak_gib']:.2f} "
                  f"| {loss} |")


if __name__ == "__main__":
    main()
