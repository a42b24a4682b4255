"""Calibration is settled when compression starts: the configured data, else the fine-tune's own training
data (its gym_config.yaml), else the built-in set, each announced in one line."""

from __future__ import annotations

import json
import logging

import yaml

from gym.delta.bitdelta import BitDeltaConfig, BitDeltaQuantizer
from gym.delta.calibration import BUILTIN_CALIBRATION, choose_calibration
from gym.delta.deltaquant import DeltaQuantConfig, DeltaQuantizer


class _Loaded:
    def __init__(self, folder):
        self.gym_source = str(folder)


def test_configured_data_wins(tmp_path):
    assert choose_calibration("mine", "d", _Loaded(tmp_path), "x") == ("mine", "d")


def test_the_runs_own_training_data_is_read_from_its_config(tmp_path, data_dir, caplog):
    run = tmp_path / "run"
    run.mkdir()
    (run / "gym_config.yaml").write_text(yaml.safe_dump({"dataset": "tiny_chat,tiny_alpaca",
                                                        "dataset_dir": str(data_dir)}))
    with caplog.at_level(logging.INFO, logger="gym.delta.calibration"):
        assert choose_calibration(None, "data", _Loaded(run), "BitDelta's scales") == ("tiny_chat", str(data_dir))
    assert "'tiny_chat', the fine-tune's training data" in caplog.text


def test_built_in_set_when_the_run_records_nothing_usable(tmp_path, caplog):
    run = tmp_path / "run"
    run.mkdir()
    (run / "gym_config.yaml").write_text(yaml.safe_dump({"dataset": "gone", "dataset_dir": str(tmp_path)}))
    with caplog.at_level(logging.INFO, logger="gym.delta.calibration"):
        for model in (_Loaded(run), object()):
            assert choose_calibration(None, "data", model, "x") == (str(BUILTIN_CALIBRATION), ".")
    assert caplog.text.count("built-in set") == 2
    rows = json.loads(BUILTIN_CALIBRATION.read_text())
    assert len(rows) == 400 and {"instruction", "output"} <= set(rows[0])


def test_seed_configs_compress_without_naming_calibration(gaussian_finetune, models, tiny_model_dir, caplog):
    """The seeds' configs (no calibration given) distil and weigh errors on the built-in set; the tokenizer
    is the base's own."""
    bitdelta = BitDeltaConfig(bits=1, group_size=128, safety_threshold=0.6, enable_deltasoup=True)
    bitdelta.distill_steps, bitdelta.distill_seq_len = 3, 32
    with caplog.at_level(logging.INFO, logger="gym.delta.calibration"):
        result = BitDeltaQuantizer(bitdelta).compress(models(tiny_model_dir), models(gaussian_finetune),
                                                      progress=False)
        assert result.header["distillation"]["steps"] == 3
        quant = DeltaQuantConfig(method="int4", per_channel=True, calibration_samples=4, seq_len=32)
        mixed = DeltaQuantizer(quant).compress(models(tiny_model_dir), models(gaussian_finetune), progress=False)
    assert mixed.entries and caplog.text.count("built-in set") == 2
