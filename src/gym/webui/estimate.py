"""Before a run starts: how much memory it needs and how long a step takes.

Two ways, and the page says which one a number came from:
- **formula** (instant): the model built on the `meta` device (no weights read) with the run's adapters,
  giving exact parameter counts; weights + gradients + AdamW's two moments for the trainable ones +
  activations (gym.train.memory's estimate) + logits, + a reference copy for stages that keep one.
- **measured** (a dry run): the same config for 3 steps into a scratch folder; the time per step is the
  median of the steps after the first (which pays for warm-up), the memory is the process's peak.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from gym.config.parser import get_train_args
from gym.core.files import human_bytes
from gym.train.outputs import read_log

REFERENCE_STAGES = {"dpo", "kto", "ppo", "grpo", "gspo", "rloo"}  # keep a frozen copy unless trained as an adapter


@dataclass
class Estimate:
    how: str  # "formula" or "measured"
    memory_bytes: int
    seconds_per_step: float | None
    parts: dict[str, int]

    def table(self) -> str:
        lines = [f"**{self.how}**: about {human_bytes(self.memory_bytes)} of memory"
                 + (f", {self.seconds_per_step:.2f} s per step" if self.seconds_per_step is not None else "")]
        lines += [f"- {name}: {human_bytes(size)}" for name, size in self.parts.items()]
        return "\n".join(lines)


def formula(config: dict[str, Any]) -> Estimate:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from gym.config.stages.registry import registered_stages
    from gym.models.adapters import count_parameters, setup_finetuning
    from gym.models.loader import resolve_model_path
    from gym.train.hf_args import machine_values
    from gym.train.memory import activation_bytes
    from gym.train.workflow import weights_dtype

    args = get_train_args(dict(config))
    path = resolve_model_path(args.model.model_name_or_path)
    model_config = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        model = setup_finetuning(AutoModelForCausalLM.from_config(model_config), args.finetuning)
    trainable, total = count_parameters(model)
    training = args.training
    weight_bytes = 2 if training.pure_bf16 else 4
    # Under bf16 mixed precision a frozen base is loaded in bf16 (gym.train.workflow.weights_dtype).
    bf16 = training.bf16 if training.bf16 is not None else machine_values(args)["bf16"]
    precision = SimpleNamespace(bf16=bf16, fsdp=training.fsdp, deepspeed=training.deepspeed)
    stage = registered_stages()[args.finetuning.stage]
    frozen_bytes = 2 if weights_dtype(args, precision, stage.data_kind) is torch.bfloat16 else weight_bytes
    base_bytes = 0.5 if args.model.quantization_bit == 4 else 1 if args.model.quantization_bit == 8 else frozen_bytes
    tokens = args.data.cutoff_len * training.per_device_train_batch_size
    text = model_config.get_text_config()
    parts = {
        "weights": int((total - trainable) * base_bytes + trainable * weight_bytes),
        "gradients": trainable * 4,
        "optimizer (AdamW moments)": trainable * 8,
        "activations": (tokens * text.num_hidden_layers * text.hidden_size * 4 * 2 if training.gradient_checkpointing
                        else activation_bytes(text, tokens)),
        "logits (float32, with their gradient)": tokens * text.vocab_size * 4 * 2,
    }
    if args.finetuning.stage in REFERENCE_STAGES and args.finetuning.finetuning_type == "full":
        parts["reference model"] = int(total * base_bytes)
    return Estimate("formula", sum(parts.values()), None, parts)


def dry_run_overrides(scratch: str) -> dict[str, Any]:
    """What turns a config into its 3-step measurement: no saving, no evaluation, nothing after training."""
    return {"max_steps": 3, "logging_steps": 1, "save_strategy": "no", "output_dir": scratch, "plot_loss": False,
            "overwrite_output_dir": True, "eval_tasks": None, "delta_compression": None, "val_size": 0.0,
            "eval_dataset": None, "report_to": "none"}


def measured(output_dir: str, console: str) -> Estimate:
    """The dry run's numbers: seconds per step from its log, peak memory from its summary line."""
    log = [e for e in read_log(output_dir) if "loss" in e and "elapsed_s" in e]
    gaps = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(log, log[1:])]
    seconds = statistics.median(gaps) if gaps else (log[0]["elapsed_s"] if log else None)
    peak = re.search(r"peak memory ([\d.]+) GiB", console)
    memory = int(float(peak.group(1)) * 2**30) if peak else 0
    return Estimate("measured", memory, seconds, {"peak memory of the dry run (process)": memory})
