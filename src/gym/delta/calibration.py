"""Which text calibrates a delta when the user names none.

BitDelta's scale distillation and DeltaQuant's sensitivity weighting both need text the fine-tune is
meant for. A config object states only what to do; the data is settled here, when compression starts:
the configured dataset, else the fine-tune's own training data (its gym_config.yaml records it), else
Gym's built-in set: the 400 instruction rows of `alpaca_en_demo`, shipped inside the package so the
default works wherever Gym is installed. Each choice is announced in one line.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import yaml

from gym.core.errors import GymError
from gym.core.files import CONFIG_FILE
from gym.core.names import split_names

logger = logging.getLogger(__name__)

BUILTIN_CALIBRATION = Path(__file__).with_name("calibration_default.json")


def source_folder(model: Any) -> Path | None:
    """The folder a model was loaded from: gym.delta.weights.load_model records it (a LoRA run's adapter
    folder, not its base); transformers records the rest as name_or_path."""
    for ref in (getattr(model, "gym_source", None), getattr(model, "name_or_path", None)):
        if ref and Path(str(ref)).expanduser().is_dir():
            return Path(str(ref)).expanduser()
    return None


def _training_data(folder: Path) -> tuple[str, str] | None:
    """(first dataset, dataset_dir) from a Gym run's gym_config.yaml, when it names one that is here."""
    from gym.data.registry import get_dataset_attrs

    try:
        saved = yaml.safe_load((folder / CONFIG_FILE).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return None
    names = saved.get("dataset")
    names = split_names(names) if isinstance(names, str) else list(names or [])
    if not names:
        return None
    dataset_dir = str(saved.get("dataset_dir") or "data")
    try:
        attr = get_dataset_attrs(names[0], dataset_dir)[0]
    except GymError:  # recorded relative to another working directory, or removed since
        return None
    if attr.load_from == "hub" and os.environ.get("HF_HUB_OFFLINE") == "1":
        return None
    return names[0], dataset_dir


def choose_calibration(configured: str | None, configured_dir: str, finetuned: Any, what: str) -> tuple[str, str]:
    """(dataset, dataset_dir) to calibrate `what` ("BitDelta's scales", ...) on."""
    if configured is not None:
        return configured, configured_dir
    folder = source_folder(finetuned)
    found = _training_data(folder) if folder is not None and (folder / CONFIG_FILE).is_file() else None
    if found is not None:
        logger.info("Calibrating %s on '%s', the fine-tune's training data (from %s).", what, found[0],
                    folder / CONFIG_FILE if folder else "")
        return found
    logger.info("Calibrating %s on Gym's built-in set (alpaca_en_demo, 400 instructions); set calibration= to use "
                "the fine-tune's own data.", what)
    return str(BUILTIN_CALIBRATION), "."


def tokenizer_for(base: Any, tokenizer: Any) -> Any:
    """The given tokenizer, else the base model's own (from the folder it was loaded from)."""
    if tokenizer is not None:
        return tokenizer
    folder = source_folder(base)
    if folder is None:
        return None
    from gym.models.loader import load_tokenizer

    return load_tokenizer(str(folder))
