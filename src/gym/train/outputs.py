"""What a training run leaves behind (installed by gym.train.installing, so that a crash never corrupts a finished
result). The folder is a plain PEFT adapter or transformers model folder, plus the tokenizer,
`gym_config.yaml` (the resolved config), `gym_manifest.json` (listing its `files`),
`trainer_log.jsonl` and, with `plot_loss`, `training_loss.png`.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from gym.config.aliases import HIDDEN
from gym.config.args import TrainArgs
from gym.config.finetuning import ADAPTER_TYPES
from gym.core.errors import OutputError
from gym.core.files import (
    CONFIG_FILE,
    FORMAT_VERSION,
    LOG_FILE,
    MANIFEST_FILE,
    check_free_space,
    readable_as_umask,
    temp_path,
    write_manifest,
)
from gym.core.results import RunResult
from gym.core.version import __version__
from gym.train.installing import install_final, is_finished_output

ExtraFiles = Callable[[Path], None]  # writes a method's own files (e.g. a value head) into the output


def read_log(output_dir: str | Path) -> list[dict[str, Any]]:
    """The run's log entries (trainer_log.jsonl); a line cut short by a crash is left out."""
    path = Path(output_dir) / LOG_FILE
    if not path.is_file():
        return []
    entries = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return entries


def completed_run(args: TrainArgs[Any], resuming: bool) -> RunResult | None:
    """Asked to resume a run whose output is already finished: the result as it stands, so nothing trains
    again (unless the config now asks for more steps than were trained, which resumes as usual)."""
    out = Path(args.output_dir)
    if not resuming or not is_finished_output(out):
        return None
    manifest = json.loads((out / MANIFEST_FILE).read_text(encoding="utf-8"))
    done = int(manifest.get("global_step", 0))
    log = read_log(out)
    target = args.training.max_steps if args.training.max_steps > 0 else max(
        (int(e.get("max_steps", 0)) for e in log), default=done)
    if done < target:
        return None
    losses = [e["loss"] for e in log if "loss" in e]
    return RunResult(output_dir=str(out), global_step=done, final_loss=losses[-1] if losses else None,
                     tokens_per_second=0.0, peak_memory_bytes=0, train_seconds=0.0,
                     metrics={"already_complete": True})


def resolved_config(args: TrainArgs[Any], model_path: str) -> dict[str, Any]:
    """The config as run: every model/data/finetuning/generating key, and the training keys that differ
    from Hugging Face's defaults (the other hundred are noise)."""
    config: dict[str, Any] = {}
    for part in (args.model, args.data, args.finetuning, args.generating):
        for f in dataclasses.fields(part):
            if f.init:
                config[f.name] = getattr(part, f.name)
    config.update({k: v for k, v in args.training.non_defaults().items() if k != "output_dir"})
    if args.options is not None:
        config.update(dataclasses.asdict(args.options))
    config["resolved_model_path"] = model_path
    for key in config:
        if key.endswith("hub_token") and config[key]:
            config[key] = HIDDEN  # a credential: never written to disk or sent to a tracker
    plain: dict[str, Any] = _plain(config)
    return plain


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    if value is None or isinstance(value, (int, float, str, bool)):
        return value
    return str(value)


def save_final(model: Any, tokenizer: Any, args: TrainArgs[Any], model_path: str, global_step: int,
               pissa_init_dir: str | None = None, extra: ExtraFiles | None = None,
               state_dict: dict[str, Any] | None = None) -> Path:
    """Write the result into output_dir; `extra(tmp)` adds a method's own files (e.g. a value head).
    `state_dict`: the full weights of a sharded model, gathered from every rank (else the model's own are saved)."""
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    check_free_space(out, sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
                     if args.finetuning.finetuning_type in ADAPTER_TYPES
                     else sum(p.numel() * p.element_size() for p in model.parameters()))
    tmp = temp_path(out / "final")
    shutil.rmtree(tmp, ignore_errors=True)
    gathered = {} if state_dict is None else {"state_dict": state_dict}
    if pissa_init_dir is not None:
        # Convert PiSSA back to a plain LoRA delta, so the adapter applies to the original base model.
        model.save_pretrained(tmp, path_initial_model_for_weight_conversion=pissa_init_dir, **gathered)
    else:
        model.save_pretrained(tmp, **gathered)
    if args.finetuning.finetuning_type in ADAPTER_TYPES:
        # Converting PiSSA to plain LoRA doubles the rank, so only the saved names are checked then.
        verify_adapter(tmp, model, state_dict, check_shapes=pissa_init_dir is None)
    tokenizer.save_pretrained(tmp)
    (tmp / CONFIG_FILE).write_text(yaml.safe_dump(resolved_config(args, model_path), sort_keys=False))
    manifest = {
        "what": ("lora-adapter" if args.finetuning.finetuning_type == "lora" else
                 "adapter" if args.finetuning.finetuning_type in ADAPTER_TYPES else "model"),
        "stage": args.finetuning.stage,
        "finetuning_type": args.finetuning.finetuning_type,
        "base_model": args.model.model_name_or_path or "smollm2-135m",
        "resolved_base_path": model_path,
        "format_version": FORMAT_VERSION,
        "gym_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "global_step": global_step,
    }
    if extra is not None:
        extra(tmp)
    write_manifest(tmp, manifest)
    readable_as_umask(tmp)
    install_final(tmp, out)
    tmp.rmdir()
    return out


def verify_adapter(folder: Path, model: Any, state_dict: dict[str, Any] | None = None,
                   check_shapes: bool = True) -> None:
    """The adapter just saved holds every trainable tensor, at its full shape, none empty. Sharded runs (ZeRO-3,
    FSDP) that save without gathering the full state write an adapter of empty tensors that loads "fine" and does
    nothing; that is an error here, never a silent file."""
    from peft import get_peft_model_state_dict
    from safetensors import safe_open

    path = folder / "adapter_model.safetensors"
    if not path.is_file():
        raise OutputError(f"The adapter was not saved: {path} is missing.")
    # The shapes the saved tensors must have: those of the gathered state of a sharded model, else the model's own.
    expected = {name: list(tensor.shape) for name, tensor in get_peft_model_state_dict(model, state_dict).items()}
    with safe_open(str(path), framework="pt") as saved:
        shapes = {key: list(saved.get_slice(key).get_shape()) for key in saved.keys()}  # noqa: SIM118
    empty = sorted(k for k, shape in shapes.items() if not shape or 0 in shape)
    wrong = sorted(k for k, shape in shapes.items()
                   if check_shapes and k in expected and shape != expected[k] and k not in empty)
    if not shapes or empty or wrong or shapes.keys() != expected.keys():
        missing = sorted(expected.keys() - shapes.keys())
        what = (f"{len(empty)} empty tensors (e.g. {empty[0]})" if empty else
                f"{len(wrong)} tensors of the wrong shape (e.g. {wrong[0]}: {shapes[wrong[0]]}, expected "
                f"{expected[wrong[0]]})" if wrong else
                f"{len(missing)} missing tensors (e.g. {missing[0]})" if missing else "no tensors")
        raise OutputError(f"The saved adapter {path} has {what}: the weights were not gathered before saving (a "
                          "sharded run, ZeRO-3 or FSDP, must save the full state). Nothing was written over the "
                          "output; the last checkpoint is intact.")


# Metrics worth a picture, when a run logs them: the loss, and what alignment stages optimise.
PLOTS = {"loss": "training_loss.png", "reward": "training_reward.png",
         "rewards/accuracies": "training_rewards_accuracies.png", "accuracy": "training_accuracy.png"}


def plot_loss(output_dir: str | Path, log: list[dict[str, Any]]) -> list[Path]:
    """training_loss.png (and, for alignment stages, their reward curves) from the run's log entries."""
    return [path for key, name in PLOTS.items() if (path := plot_metric(output_dir, log, key, name)) is not None]


def plot_metric(output_dir: str | Path, log: list[dict[str, Any]], key: str, file_name: str) -> Path | None:
    """A logged metric per step, raw and as a moving average, saved as output_dir/file_name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [(e["step"], e[key]) for e in log if key in e]
    if not points:
        return None
    steps, values = zip(*points)
    window = max(1, len(values) // 10)
    smooth = [sum(values[max(0, i - window + 1) : i + 1]) / len(values[max(0, i - window + 1) : i + 1])
              for i in range(len(values))]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, values, alpha=0.4, label=key)
    ax.plot(steps, smooth, label=f"moving average ({window})")
    ax.set_xlabel("step")
    ax.set_ylabel(key if key != "loss" else "training loss")
    ax.legend()
    path = Path(output_dir) / file_name
    tmp = temp_path(path)
    fig.savefig(tmp, dpi=100, bbox_inches="tight", format="png")
    plt.close(fig)
    os.replace(tmp, path)
    return path
