"""`report_to`: the experiment trackers a run logs to (docs/training.md, "Experiment tracking").

Checked when the config is read, so that a tracker whose package is missing, or a misspelt name, fails
before the model loads with the pip command to run, instead of as a RuntimeError inside the Trainer.
"""

from __future__ import annotations

import importlib.util
import os

from gym.core.errors import ConfigError
from gym.core.names import did_you_mean

INSTALL = "pip install 'zoo-gym[tracking]'"

# Every name transformers' `report_to` takes (its INTEGRATION_TO_CALLBACK), written out so that reading a config
# imports no transformers; tests/config/test_hf_training_fields.py checks it against the installed version.
INTEGRATIONS = ("azure_ml", "comet_ml", "mlflow", "neptune", "tensorboard", "trackio", "wandb", "codecarbon", "clearml",
                "dagshub", "flyte", "dvclive", "swanlab", "kubeflow")

# The trackers Gym tests and adds its own config to; any module in the tuple is enough (transformers'
# TensorBoard callback writes through tensorboardX when tensorboard is missing).
TRACKERS: dict[str, tuple[str, ...]] = {
    "wandb": ("wandb",),
    "tensorboard": ("tensorboard", "tensorboardX"),
    "mlflow": ("mlflow",),
}


def split_report_to(value: str | list[str] | None) -> str | list[str] | None:
    """`"wandb,tensorboard"` -> ["wandb", "tensorboard"]. The parser joins a YAML list for a `str | list`
    field into such a string, and the command line gives one; transformers would read it as one name."""
    if isinstance(value, str) and "," in value:
        return [name.strip() for name in value.split(",") if name.strip()]
    return value


def check_report_to(report_to: list[str]) -> None:
    for name in report_to:
        if name in TRACKERS:
            if all(importlib.util.find_spec(module) is None for module in TRACKERS[name]):
                raise ConfigError(f"'report_to: {name}' needs the {TRACKERS[name][0]} package, which is not "
                                  f"installed: {INSTALL}, or take {name} out of report_to.")
            if name == "mlflow" and os.environ.get("DISABLE_MLFLOW_INTEGRATION", "").upper() == "TRUE":
                raise ConfigError("'report_to: mlflow' while DISABLE_MLFLOW_INTEGRATION is set: unset one of them.")
            continue
        if name in ("none", "all"):  # transformers reads them only alone: `report_to: [none]` is `report_to: none`
            raise ConfigError(f"'report_to: {name}' stands alone, not in a list with other trackers.")
        if name not in INTEGRATIONS:
            known = ["none", "all", *INTEGRATIONS]
            raise ConfigError(f"'report_to' names an unknown tracker {name!r}.{did_you_mean(name, known)} "
                              f"Choose from: {', '.join(known)}.")
