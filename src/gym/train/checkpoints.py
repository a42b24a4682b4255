"""Checkpoints: finding the one to resume from (every stage), and writing them for Gym's own loops.

`resume_from_checkpoint: true` resumes from the newest *complete* `checkpoint-N/` in output_dir: one
whose `trainer_state.json` (written last, by the Hugging Face Trainer and by Gym's loops alike) reads.

For Gym's own loops (stage ppo), which do not run under the Hugging Face Trainer, `checkpoint-N/`
holds the trainable weights (safetensors), the optimizer, scheduler and random-number states, and
`trainer_state.json` with the loop's own counters, written under a temporary name and renamed. Only
trainable parameters are saved: frozen weights come from the base model again on resume.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import zipfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from gym.config.args import TrainArgs
from gym.core.errors import ConfigError
from gym.core.files import readable_as_umask, temp_path
from gym.core.safetensors_files import first_damaged, load_safetensors

WEIGHTS_FILE = "trainable.safetensors"
LOOP_STATE_FILE = "loop_state.pt"
STATE_FILE = "trainer_state.json"
CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")


def last_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest checkpoint that was completely written (its trainer_state.json is saved last)."""
    root = Path(output_dir)
    if not root.is_dir():
        return None
    complete = _complete_checkpoints(root)  # one interrupted while saving is passed over for the one before
    return complete[-1] if complete else None


def remove_incomplete_checkpoints(output_dir: str | Path) -> list[Path]:
    """Delete checkpoint folders whose trainer_state.json (written last) is missing or unreadable: what a run
    killed or out of disk while saving left. Call it only while owning output_dir (gym.core.files.OutputLock)."""
    root = Path(output_dir)
    removed: list[Path] = []
    if not root.is_dir():
        return removed
    for path in root.iterdir():
        if CHECKPOINT_NAME.match(path.name) and path.is_dir() and not _complete(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def resume_requested(args: TrainArgs[Any]) -> bool:
    """Whether `resume_from_checkpoint` asks to resume (true, or a checkpoint path)."""
    return args.training.resume_from_checkpoint not in (None, False, "", "false", "False")


def resolve_resume(args: TrainArgs[Any]) -> str | None:
    """`resume_from_checkpoint`: true -> the last complete checkpoint; a path -> that path."""
    value = args.training.resume_from_checkpoint
    if not resume_requested(args):
        return None
    if value is True or value in ("true", "True"):
        found = last_checkpoint(args.output_dir)
        if found is None:
            raise ConfigError(f"resume_from_checkpoint: true, but {args.output_dir} has no complete "
                              "checkpoint yet. Remove the key to start from scratch.")
        check_checkpoint_files(found)
        return str(found)
    if not isinstance(value, str) or not (Path(value) / STATE_FILE).is_file():
        raise ConfigError(f"resume_from_checkpoint: {value} is not a complete checkpoint folder.")
    check_checkpoint_files(Path(value))
    return str(value)


def check_checkpoint_files(folder: Path) -> None:
    """A checkpoint's files are whole, judged from their ends and headers (no tensor is read). A damaged one (a copy
    cut short, a disk error) was a torch traceback, or safetensors' unnamed header error, once the model had
    loaded."""
    for path in sorted(folder.iterdir()):
        if not path.is_file():
            continue
        if path.suffix == ".safetensors":  # safetensors checks, on opening, that its header's tensors fit the file
            problem = "not a whole safetensors file" if first_damaged([path]) is not None else None
        else:  # torch's files are zip archives, whose directory is written last
            problem = None if path.suffix not in (".pt", ".pth", ".bin") or zipfile.is_zipfile(path) else (
                "not a whole torch file")
        if problem is not None:
            earlier = [p for p in _complete_checkpoints(folder.parent) if _step(p) < _step(folder)]
            instead = (f"resume from the one before (resume_from_checkpoint: {earlier[-1]}), or "
                       if earlier else "")
            raise ConfigError(f"{path} is damaged or incomplete ({problem}), so {folder.name} cannot be resumed: "
                              f"{instead}remove resume_from_checkpoint to start again.")


def _step(folder: Path) -> int:
    found = CHECKPOINT_NAME.match(folder.name)
    return int(found.group(1)) if found else -1


def _complete_checkpoints(output_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    return sorted((p for p in output_dir.iterdir() if CHECKPOINT_NAME.match(p.name) and p.is_dir() and _complete(p)),
                  key=_step)


def _complete(checkpoint: Path) -> bool:
    """Whether its trainer_state.json, written last, reads: a checkpoint cut short while saving has none."""
    try:
        json.loads((checkpoint / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return False
    return True


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
    folder = Path(output_dir) / f"checkpoint-{step}"
    tmp = temp_path(folder)
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
    readable_as_umask(tmp)
    os.replace(tmp, folder)
    if total_limit:
        steps = sorted(int(m[1]) for p in Path(output_dir).iterdir() if (m := CHECKPOINT_NAME.match(p.name)))
        for old in steps[:-total_limit]:
            shutil.rmtree(Path(output_dir) / f"checkpoint-{old}", ignore_errors=True)
    return folder


def load_checkpoint(folder: str | Path, modules: dict[str, torch.nn.Module], optimizer: torch.optim.Optimizer,
                    scheduler: Any, generator: torch.Generator) -> dict[str, Any]:
    """Restore what save_checkpoint wrote into the freshly built loop; returns the loop's counters."""
    folder = Path(folder)
    if not (folder / WEIGHTS_FILE).is_file():
        raise ConfigError(f"{folder} is not a checkpoint of this kind of run (no {WEIGHTS_FILE}); it was written by "
                          "another stage. Resume with the stage that wrote it, or remove resume_from_checkpoint.")
    saved = load_safetensors(folder / WEIGHTS_FILE)  # a damaged file named
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
    state: dict[str, Any] = json.loads((folder / STATE_FILE).read_text())
    return state
