"""An export's errors name its options as the caller gave them: the CLI's flags (`--format hf`) on the command line,
Trainer.export's keywords (`format='hf'`) from Python, even when the error is raised deep in a writer."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tests.conftest import tiny_sft_config
from tests.gym_cli import assert_one_line_error, gym_here

from gym import Trainer, TrainingConfig
from gym.core.errors import ConfigError, OutputError


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory, tokenizer) -> Path:
    """A tiny GPT-2: an architecture the GGUF writer does not hold, refused in gguf_file, far below the door."""
    from transformers import GPT2Config, GPT2LMHeadModel

    path = tmp_path_factory.mktemp("tiny-gpt2")
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _trainer(model_dir: Path, data_dir: Path, tmp_path: Path) -> Trainer:
    trainer = Trainer(TrainingConfig(tiny_sft_config(model_dir, data_dir, tmp_path / "run")))
    trainer.model_dir = model_dir  # what export() exports, as after apply_deltasoup
    return trainer


def test_python_callers_are_told_keywords(gpt2_dir, tiny_model_dir, data_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"this one is 'gpt2'\. Export it with format='hf'\.") as caught:
        _trainer(gpt2_dir, data_dir, tmp_path).export(tmp_path / "gpt2.gguf")
    assert "--" not in str(caught.value)

    trainer = _trainer(tiny_model_dir, data_dir, tmp_path)
    with pytest.raises(ConfigError, match=r"^format='ollama' writes a folder .*: give path a folder\."):
        trainer.export(tmp_path / "model.gguf", format="ollama")
    with pytest.raises(ConfigError, match=r"^export_format='ollama' writes a folder"):  # the name the caller used
        trainer.export(tmp_path / "model.gguf", export_format="ollama")
    (tmp_path / "model.gguf").write_bytes(b"an earlier export")
    with pytest.raises(OutputError, match=r"already exists \(a file\); pass export_overwrite=True to replace it"):
        trainer.export(tmp_path / "model.gguf")
    with pytest.raises(ConfigError, match=r"export_dtype float16 applies to format='hf'; a GGUF's type is export_type"):
        trainer.export(tmp_path / "model.gguf", export_dtype="float16")


def test_the_command_line_is_told_flags(gpt2_dir, tiny_model_dir, tmp_path):
    assert_one_line_error(gym_here("export", gpt2_dir, "--format", "gguf", "--export_dir", tmp_path / "m.gguf"),
                          "this one is 'gpt2'. Export it with --format hf.")
    (tmp_path / "m.gguf").write_bytes(b"an earlier export")
    assert_one_line_error(gym_here("export", tiny_model_dir, "--format", "gguf", "--export_dir", tmp_path / "m.gguf"),
                          "pass --overwrite to replace it")
    assert_one_line_error(gym_here("export", tiny_model_dir, "--format", "ollama", "--export_dir", tmp_path / "o.gguf"),
                          "--format ollama writes a folder (the GGUF and its Modelfile): give --export_dir a folder.")
    assert_one_line_error(gym_here("export", tiny_model_dir, "--export_format", "ollama", "--export_dir",
                                   tmp_path / "o.gguf"), "error: --export_format ollama writes a folder")


def test_python_callers_are_told_to_train_a_run_not_trained_yet(tiny_model_dir, data_dir, tmp_path):
    # Raised below the export, where the run is resolved, it named the CLI's --model_name_or_path.
    untrained = Trainer(TrainingConfig(tiny_sft_config(tiny_model_dir, data_dir, tmp_path / "nowhere")))
    with pytest.raises(ConfigError, match=r"nowhere holds no finished run: train it first \(Trainer\.train\(\)\)") \
            as caught:
        untrained.export(tmp_path / "m.gguf")
    assert "--" not in str(caught.value)
    assert not (tmp_path / "m.gguf").exists()


def test_python_callers_are_told_the_keyword_for_an_adapters_own_base(tiny_model_dir, narrow_adapter, data_dir,
                                                                      tmp_path):
    trained_on = narrow_adapter.parent / "base"
    # Raised where the adapter is merged, below the export, it named the CLI's --model_name_or_path.
    hint = re.escape(f"It was trained on {trained_on}: pass model_name_or_path='{trained_on}'.")
    with pytest.raises(ConfigError, match=hint + "$"):
        _trainer(tiny_model_dir, data_dir, tmp_path).export(tmp_path / "merged",
                                                            adapter_name_or_path=str(narrow_adapter))


def test_the_command_line_is_told_the_flag_for_a_run_not_trained_yet(tiny_model_dir, data_dir, tmp_path):
    config = tmp_path / "untrained.yaml"
    config.write_text(f"model_name_or_path: {tiny_model_dir}\noutput_dir: {tmp_path / 'nowhere'}\n")
    assert_one_line_error(gym_here("export", config, "--export_dir", tmp_path / "out"),
                          "holds no finished run: train it first (gym train CONFIG), or export the base itself with "
                          "--model_name_or_path (and no config).")
