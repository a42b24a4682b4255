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


def test_a_vision_language_model_is_refused_before_anything_trains(tmp_path, capsys, monkeypatch):
    """It failed in transformers ("Unrecognized configuration class LlavaConfig"), and for a variant only after
    the user's rows had trained."""
    from transformers import LlavaConfig

    from gym.cli import main

    LlavaConfig().save_pretrained(tmp_path / "vlm")  # the config says what the model is: no weight is read
    (tmp_path / "vlm" / "model.safetensors").write_bytes(b"")
    (tmp_path / "rows.json").write_text('[{"instruction": "Hi", "output": "Hello."}]')
    with pytest.raises(ConfigError, match="vlm is a vision-language model: deltas and per-user variants"):
        load_model(str(tmp_path / "vlm"))
    trained: list[object] = []
    monkeypatch.setattr("gym.train.run.run_training", lambda *a, **k: trained.append(a))
    assert main(["variants", "create", str(tmp_path / "store"), "--base", str(tmp_path / "vlm"), "--user", "u",
                 "--data", str(tmp_path / "rows.json")]) == 2
    assert "is a vision-language model" in capsys.readouterr().err
    assert trained == [] and not (tmp_path / "store").exists()
