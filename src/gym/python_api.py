"""The Python door: the same config and the same run as `gym train`, built from keyword arguments.

    from gym import Trainer, TrainingConfig
    result = Trainer(TrainingConfig(model="smollm2-135m", algorithm="sft", dataset="identity")).train()
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gym.config.args import TrainArgs
from gym.config.files import ConfigSource, as_config_dict
from gym.config.parser import get_train_args
from gym.core.results import RunResult
from gym.workflows.training import run_exp


class TrainingConfig:
    """Any `gym train` key as a keyword (`model=` and `algorithm=` are accepted too). Each key and value is
    checked at construction, with the CLI's errors; what the whole config needs (GRPO's reward, a dataset)
    and what the machine needs (a GPU for use_unsloth) are checked when training starts, so a config can be
    completed later (`Trainer.train(dataset=...)`) or written where it will not run."""

    def __init__(self, config: ConfigSource = None, **keys: Any) -> None:
        self.values: dict[str, Any] = {**as_config_dict(config), **keys}
        self.args: TrainArgs[Any] = get_train_args(self.values, complete=False)

    def replace(self, **keys: Any) -> TrainingConfig:
        return TrainingConfig({**self.values, **keys})

    def __repr__(self) -> str:
        return f"TrainingConfig({self.values!r})"


@dataclass
class SoupApplied:
    """What Trainer.apply_deltasoup did."""

    soup: Path  # the soup folder
    contribution: Any  # this run's ContributionRecord (status: accepted/rejected, reason), None if not contributed
    model_dir: Path | None  # base + the soup's latest aggregate, now this trainer's model; None: nothing loaded
    round: int | None  # the aggregated round loaded


class Trainer:
    def __init__(self, config: TrainingConfig | ConfigSource) -> None:
        self.config = config if isinstance(config, TrainingConfig) else TrainingConfig(config)
        self.model_dir: Path | None = None  # set by apply_deltasoup(load=True): what export() exports from then on

    def train(self, dataset: str | None = None, **overrides: Any) -> RunResult:
        """Run the configured job; `dataset=` and other keys complete or override the config (kept for export)."""
        if dataset is not None:
            overrides["dataset"] = dataset
        if overrides:
            self.config = self.config.replace(**overrides)
        result = run_exp(self.config.values)
        self.model_dir = None
        return result

    def apply_deltasoup(self, soup: Any = None, *, contribute: bool = True, load: bool = True,
                        user_id: str | None = None, model_dir: str | os.PathLike[str] | None = None) -> SoupApplied:
        """Share this run with a DeltaSoup, and take the community's improvements from it.

        soup: a DeltaSoup, a soup folder, or None for this base's soup on this machine ($GYM_HOME/soups/<base>,
        created on first use). contribute: add the trained result (adapter or model folder) to the soup's open
        round as `user_id` (default: $USER); the soup validates it and records it accepted or rejected.
        load: write base + the soup's latest aggregated round to `model_dir` (default: <output_dir>-deltasoup),
        which becomes this trainer's model (export() exports it). Aggregating is the soup's job (soup.aggregate,
        `gym soup aggregate`): with no aggregated round yet, nothing is loaded (model_dir None, and a log line).
        """
        import getpass
        import json
        import logging

        from gym.core.errors import ConfigError
        from gym.core.files import MANIFEST_FILE
        from gym.soup import DeltaSoup

        run = Path(self.config.args.output_dir)
        if not (run / MANIFEST_FILE).is_file():
            raise ConfigError(f"{run} holds no finished run: train first (apply_deltasoup shares the trained model).")
        base = json.loads((run / MANIFEST_FILE).read_text(encoding="utf-8"))["base_model"]
        if not isinstance(soup, DeltaSoup):
            soup = DeltaSoup(path=soup, base_model=base) if soup is not None else DeltaSoup(base_model=base)
        record = soup.contribute(user_id or getpass.getuser() or "local", str(run)) if contribute else None
        applied = SoupApplied(Path(str(soup.path)), record, None, None)
        if load:
            rounds = soup.store.rounds()
            if not rounds:
                logging.getLogger(__name__).info("%s has no aggregated round yet: nothing to load (the model stays "
                                                 "this run's).", soup.path)
                return applied
            target = Path(model_dir) if model_dir is not None else run.with_name(run.name + "-deltasoup")
            applied.model_dir = soup.write_model(target, overwrite=True)
            applied.round = rounds[-1].id
            self.model_dir = applied.model_dir
        return applied

    def export(self, path: str | os.PathLike[str], format: str | None = None, export_type: str | None = None,
               **keys: Any) -> Path:
        """Export the trained run (this config's output_dir, or the soup model apply_deltasoup loaded) as
        `format`: "hf" (a folder), "gguf" (the default for a path ending in .gguf), "gguf-lora". `export_type`:
        the GGUF type (f16, q8_0, q4_k_m, ...) or "bitdelta" (the fine-tune as its BitDelta variant serves it);
        the documents' keyword for it is accepted too (gym.config.aliases). More keys: those of `gym export`
        (docs/export.md)."""
        from gym.export.config import as_given
        from gym.export.run import run_export
        from gym.export.spelling import PYTHON

        chosen = format or ("gguf" if str(path).endswith(".gguf") else "hf")
        source = {"model_name_or_path": str(self.model_dir)} if self.model_dir is not None else {
            "output_dir": self.config.args.output_dir}
        typed = {"export_type": export_type} if export_type is not None else {}
        config = {**source, "export_dir": str(path), "export_format": chosen, **typed, **keys}
        return run_export(config, as_given(PYTHON, keys))  # errors name Trainer.export's keywords, not --flags
