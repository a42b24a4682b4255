"""An adapter loaded onto the wrong base is one line that names the mismatch and the base it was trained on."""

from __future__ import annotations

import pytest

from gym.core.errors import ConfigError
from gym.delta.weights import load_model
from gym.workflows.training import run_exp


def test_an_adapter_on_the_wrong_base_names_the_right_one(train_config, tiny_model_dir):
    output = run_exp(train_config(max_steps=1)).output_dir
    with pytest.raises(ConfigError) as caught:
        load_model(output, "smollm2-135m")
    message = str(caught.value)
    assert "does not fit the base smollm2-135m (size mismatch" in message
    assert f"pass --base {tiny_model_dir}" in message and "\n" not in message
