"""Checkpoints for Gym's own training loops (stage ppo), which do not run under the Hugging Face Trainer.

`checkpoint-N/` holds the trainable weights (safetensors), the optimizer, scheduler and random-number
states, and `trainer_state.json` with the loop's own counters. It is written under a temporary name
and renamed, so `resume_from_checkpoint: true` (which looks for `trainer_state.json`, as for the
Trainer's checkpoints) only ever finds complete ones. Only trainable parameters are saved: frozen
weights come from the base model again on resume.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from gym.errors import ConfigError

WEIGHTS_FILE = "trainable.safetensors"
LOOP_STATE_FILE = "loop_state.pt"
STATE_FILE = "trainer_state.json"


def save_every(save_strategy: Any, save_steps: float, max_steps: int) -> int | None:
    """Steps between checkpoints for `save_strategy`/`save_steps` (a fraction of max_steps when < 1); None: never."""
    if str(getattr(save_strategy, "value", save_strategy)) != "steps":
        return None
    return max(1, int(save_steps) if save_steps >= 1 else round(save_steps * max_steps))


def _trainable(modules: dict[str, torch.nn.Module]) -> dict[str, torch.nn.Parameter]:
    return {f"{prefix}.{name}": p for prefix, module in modules.items()
            for name, p in module.named_parameters() if p.requires_grad}


def save_checkpoint(output_dir: str | Path, step: int, modules: dict[str, torch.nn.Module],
                    optimizer: torch.optim.Optimizer, scheduler: Any, generator: torch.Generator,
                    state: dict[str, Any], total_limit: int | None = None) -> Path:
    """Write checkpoint-{step}; with total_limit, keep only that many of the newest."""
    from safetensors.torch import save_file

    folder = Path(output_dir) / f"checkpoint-{step}"
    tmp = folder.with_name(f".tmp-{folder.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({name: p.detach().cpu().contiguous() for name, p in _trainable(modules).items()},
              str(tmp / WEIGHTS_FILE), metadata={"format": "pt", "what": "gym-loop-checkpoint"})
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "torch_rng": torch.get_rng_state(), "generator": generator.get_state(),
                "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
               tmp / LOOP_STATE_FILE)
    (tmp / STATE_FILE).write_text(json.dumps({"global_step": step, **state}, indent=2))
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(tmp, folder)
    if total_limit:
        steps = sorted(int(m[1]) for p in Path(output_dir).iterdir() if (m := re.fullmatch(r"checkpoint-(\d+)", p.name)))
        for old in steps[:-total_limit]:
            shutil.rmtree(Path(output_dir) / f"checkpoint-{old}", ignore_errors=True)
    return folder


def load_checkpoint(folder: str | Path, modules: dict[str, torch.nn.Module], optimizer: torch.optim.Optimizer,
                    scheduler: Any, generator: torch.Generator) -> dict[str, Any]:
    """Restore what save_checkpoint wrote into the freshly built loop; returns the loop's counters."""
    from safetensors.torch import load_file

    folder = Path(folder)
    if not (folder / WEIGHTS_FILE).is_file():
        raise ConfigError(f"{folder} is not a checkpoint of this kind of run (no {WEIGHTS_FILE}); it was written by "
                          "another stage. Resume with the stage that wrote it, or remove resume_from_checkpoint.")
    saved = load_file(str(folder / WEIGHTS_FILE))
    params = _trainable(modules)
    if set(saved) != set(params):
        differ = sorted(set(saved) ^ set(params))
        raise ConfigError(f"{folder} does not match this run's trainable parameters (e.g. {differ[0]}): it was "
                          "saved with another finetuning_type, adapter or model.")
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(saved[name])
    blob = torch.load(folder / LOOP_STATE_FILE, weights_only=True)  # tensors and plain values only
    optimizer.load_state_dict(blob["optimizer"])
    scheduler.load_state_dict(blob["scheduler"])
    torch.set_rng_state(blob["torch_rng"])
    generator.set_state(blob["generator"])
    if blob["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(blob["cuda_rng"])
    return json.loads((folder / STATE_FILE).read_text())
