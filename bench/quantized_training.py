"""Quantized training: what QLoRA saves and what it costs, against plain LoRA on the float32 base, in one run.

The embedded SmolLM2-135M-Instruct, SFT with LoRA (r=16, all linear layers) on the alpaca demo rows, the same
steps, batch and seed for every row. Each configuration runs `gym train` in its own process, so its peak memory
is its own. Columns: bytes of the base's linear weights as loaded (what quantization shrinks), the process's
resident memory once the model is ready and its peak (loading included: transformers reads the float weights
before quantizing them), seconds per optimizer step (after a first, untimed step), and the final training loss.

    python bench/quantized_training.py [--steps 4] [--batch 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CONFIGS = {
    "LoRA, float32 base (baseline)": {},
    "QLoRA, bnb nf4 + double quant": {"quantization_bit": 4},
    "QLoRA, bnb nf4, LoftQ init": {"quantization_bit": 4, "loftq_init": True},
    "LoRA, bnb int8 base": {"quantization_bit": 8},
    "LoRA, torchao int8 base": {"quantization_bit": 8, "quantization_method": "torchao"},
}

CHILD = r"""
import json, sys, time
import torch
from transformers import TrainerCallback
from gym.train import harness, workflow
from gym.workflows.training import run_exp

config = json.loads(sys.argv[1])
seen = {}
original = workflow.train_and_save

def nbytes(t):
    # torchao's quantized weights are tensor subclasses whose outer dtype is the float one: count their parts.
    if hasattr(t, "__tensor_flatten__") and type(t) is not torch.nn.Parameter:
        names, _ = t.__tensor_flatten__()
        return sum(nbytes(getattr(t, n)) for n in names)
    return t.numel() * t.element_size()

def capture(trainer, setup, args):
    import gc, psutil
    base = trainer.model.get_base_model()
    seen["linear_bytes"] = sum(nbytes(p.data) for n, p in base.named_parameters()
                               if ".layers." in n and "lora_" not in n and n.endswith("weight")
                               and "norm" not in n)
    gc.collect()
    import ctypes; ctypes.CDLL("libc.so.6").malloc_trim(0)
    seen["rss_loaded"] = psutil.Process().memory_info().rss
    return original(trainer, setup, args)

class StepTimes(TrainerCallback):
    def __init__(self):
        self.times = []
    def on_step_begin(self, args, state, control, **kw):
        self.start = time.perf_counter()
    def on_step_end(self, args, state, control, **kw):
        self.times.append(time.perf_counter() - self.start)

workflow.train_and_save = capture
steps = StepTimes()
with harness.extra_callbacks(steps):
    result = run_exp(config)
timed = steps.times[1:] or steps.times
print("RESULT " + json.dumps({"linear_bytes": seen["linear_bytes"], "peak": result.peak_memory_bytes,
                              "rss_loaded": seen["rss_loaded"],
                              "step_s": sum(timed) / len(timed), "loss": result.final_loss}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=2)
    options = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, keys in CONFIGS.items():
            config = {"stage": "sft", "finetuning_type": "lora", "lora_rank": 16, "dataset": "alpaca_en_demo",
                      "dataset_dir": str(REPO / "data"), "cutoff_len": 256, "max_samples": 64,
                      "max_steps": options.steps, "per_device_train_batch_size": options.batch,
                      "learning_rate": 2e-4, "save_strategy": "no", "report_to": "none", "disable_tqdm": True,
                      "seed": 0, "output_dir": str(Path(tmp) / str(len(rows))), **keys}
            done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(config)], capture_output=True, text=True,
                                  cwd=REPO, check=False)
            line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                print(f"{name}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
                continue
            rows.append((name, json.loads(line[len("RESULT "):])))
    base = rows[0][1]
    print(f"\nSFT-LoRA on the embedded model, {options.steps} steps of batch {options.batch} (first step untimed)\n")
    print("| configuration | linear weights | vs baseline | RSS before training | peak RSS | s/step | vs baseline "
          "| final loss |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in rows:
        print(f"| {name} | {r['linear_bytes'] / 2**20:.1f} MiB | {r['linear_bytes'] / base['linear_bytes']:.2f}x "
              f"| {r['rss_loaded'] / 2**30:.2f} GiB | {r['peak'] / 2**30:.2f} GiB | {r['step_s']:.2f} "
              f"| {r['step_s'] / base['step_s']:.2f}x | {r['loss']:.3f} |")


if __name__ == "__main__":
    main()
