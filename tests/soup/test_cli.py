"""`gym soup` verbs in-process through gym.cli.soup.main: a whole soup's life on the tiny model."""

from __future__ import annotations

import json

import pytest
import torch

from gym.cli.soup import main
from gym.core.errors import ConfigError


def _finetune(make_finetune, i: int, scale: float = 1e-3):
    generator = torch.Generator().manual_seed(i)

    def change(name, param):
        if param.ndim == 2 and ".layers." in name:
            param.add_(torch.ones(param.shape) * 1e-3 + torch.randn(param.shape, generator=generator) * scale)

    return make_finetune(change, f"user{i}")


def test_init_contribute_status_aggregate_rewards(tiny_model_dir, make_finetune, tmp_path, capsys):
    soup = tmp_path / "soup"
    config = tmp_path / "soup.yaml"
    config.write_text("method: trimmed_mean\nreward_pool: 90\n")
    assert main(["init", str(soup), "--base", str(tiny_model_dir), "--config", str(config), "min_contributors=2",
                 "trim_percent=0.2"]) == 0
    assert "trimmed_mean" in capsys.readouterr().out
    for i in range(3):
        assert main(["contribute", str(soup), str(_finetune(make_finetune, i)), "--user", f"u{i}",
                     "--samples", "5"]) == 0
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "adapter_config.json").write_text("{}")
    (bad / "adapter_model.safetensors").write_bytes(b"")
    assert main(["contribute", str(soup), str(bad), "--user", "mallory"]) == 1  # readable config, broken adapter
    assert "Rejected mallory" in capsys.readouterr().out

    assert main(["status", str(soup)]) == 0
    out = capsys.readouterr().out
    assert "3 accepted, 1 rejected" in out and "differential privacy off" in out

    assert main(["aggregate", str(soup), "-o", str(tmp_path / "model")]) == 0
    assert "Round 1: trimmed_mean over 3" in capsys.readouterr().out
    assert (tmp_path / "model" / "config.json").is_file()

    assert main(["rewards", str(soup), "--json"]) == 0
    paid = json.loads(capsys.readouterr().out)
    assert set(paid) == {"u0", "u1", "u2", "mallory"} and sum(paid.values()) == pytest.approx(90.0)
    assert main(["rewards", str(soup), "--cumulative"]) == 0
    assert "u0" in capsys.readouterr().out

    assert main(["status", str(soup), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rounds"] == 1


def test_user_errors_are_config_errors(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match="not a soup"):
        main(["status", str(tmp_path / "nothing")])
    with pytest.raises(ConfigError, match="key=value"):
        main(["init", str(tmp_path / "s"), "--base", str(tiny_model_dir), "method"])
    with pytest.raises(ConfigError, match="Unknown DeltaSoupConfig field 'methd'. Did you mean 'method'?"):
        main(["init", str(tmp_path / "s"), "--base", str(tiny_model_dir), "methd=mean"])
    with pytest.raises(ConfigError, match="Unknown aggregation method 'meen'.* Did you mean 'mean'?"):
        main(["init", str(tmp_path / "s"), "--base", str(tiny_model_dir), "method=meen"])
    assert main(["init", str(tmp_path / "s"), "--base", str(tiny_model_dir)]) == 0
    with pytest.raises(ConfigError, match="already a soup"):
        main(["init", str(tmp_path / "s"), "--base", str(tiny_model_dir)])
    with pytest.raises(ConfigError, match="not found"):
        main(["contribute", str(tmp_path / "s"), str(tmp_path / "missing"), "--user", "a"])
    with pytest.raises(ConfigError, match="at least 3"):
        main(["aggregate", str(tmp_path / "s")])
    with pytest.raises(ConfigError, match="no aggregated round"):
        main(["rewards", str(tmp_path / "s")])
