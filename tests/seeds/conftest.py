"""The seeds (the documents Gym was first described in) as users will copy them.

Each test reproduces one snippet or YAML block with our own code: the same calls and keys, a hub model id
swapped for the tiny local model, and run settings shrunk where a snippet would train for hours. Where a
snippet asks for something this machine cannot do (a CUDA kernel, the network), the test checks the clear
error, then runs the closest thing that works.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml


@pytest.fixture()
def write_yaml(tmp_path):
    """write_yaml(text, **replace) -> the path of a YAML file holding the seed's block, keys replaced."""

    def write(text: str, name: str = "config.yaml", **replace) -> Path:
        values = yaml.safe_load(text)
        values.update(replace)
        path = tmp_path / name
        path.write_text(yaml.safe_dump(values, sort_keys=False))
        return path

    return write


@pytest.fixture(autouse=True)
def own_gym_home(tmp_path, monkeypatch):
    """Soups and variants go under $GYM_HOME by default: a fresh one per test, sharing the real one's converted
    models and compiled kernels (linked, so nothing is converted or compiled again)."""
    from gym.core.home import gym_home
    from gym.models.loader import resolve_model_path

    resolve_model_path("smollm2-135m")
    real = gym_home()
    home = tmp_path / "gym-home"
    home.mkdir()
    for child in real.iterdir():
        if child.name not in ("soups", "variants"):
            (home / child.name).symlink_to(child)
    monkeypatch.setenv("GYM_HOME", str(home))
    return home
