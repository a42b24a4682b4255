"""$GYM_HOME: where Gym keeps what it makes once per machine (the converted embedded model, built kernels, default
soups, cached base evaluations). Default ~/.cache/gym."""

from __future__ import annotations

import os
from pathlib import Path


def gym_home() -> Path:
    return Path(os.environ.get("GYM_HOME", Path.home() / ".cache" / "gym")).expanduser()
