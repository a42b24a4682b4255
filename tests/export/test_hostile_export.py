"""`gym export` against hostile outputs and adapters (issue #39): --overwrite over a folder holding the model being
exported (or the user's files) is refused with everything left in place, and a LoRA adapter trained on a base of
another size is refused naming the matrix, instead of a GGUF adapter llama.cpp cannot apply."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from tests.gym_cli import assert_one_line_error, gym_here


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("export_format", ["hf", "gguf"])
def test_overwrite_never_deletes_the_model_it_exports(tiny_model_dir, tmp_path, export_format):
    # The case: export_dir D holding the source model D/model, plus a file of the user's; --overwrite deleted
    # both. D == M is the same mistake.
    exports = tmp_path / "exports"
    model = exports / "model"
    shutil.copytree(tiny_model_dir, model)
    (exports / "unrelated.txt").write_text("the user's file")
    before = _snapshot(exports)
    for export_dir, where in ((exports, "holds"), (model, "is")):
        done = gym_here("export", "--model_name_or_path", model, "--format", export_format, "--export_dir",
                        export_dir, "--overwrite")
        assert_one_line_error(done, f"gym: error: The output {export_dir} {where} the input {model}")
    assert _snapshot(exports) == before


def test_overwrite_replaces_only_a_folder_gym_exported(tiny_model_dir, tmp_path):
    out = tmp_path / "export"
    export = ("export", "--model_name_or_path", tiny_model_dir, "--export_dir")
    assert gym_here(*export, out).returncode == 0
    assert gym_here(*export, out, "--overwrite").returncode == 0
    (out / "README.md").write_text("my model card")
    before = _snapshot(out)
    assert_one_line_error(gym_here(*export, out, "--overwrite"), "holds README.md, which Gym did not write there")
    assert _snapshot(out) == before

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    assert_one_line_error(gym_here(*export, mine, "--overwrite"), f"{mine} is not a folder Gym wrote")
    assert (mine / "thesis.tex").read_text() == "years of work"


def test_a_gguf_lora_of_an_adapter_for_another_base_size_is_refused(narrow_adapter, tiny_model_dir, tmp_path):
    out = tmp_path / "adapter.gguf"
    done = gym_here("export", "--model_name_or_path", tiny_model_dir, "--adapter_name_or_path", narrow_adapter,
                    "--format", "gguf-lora", "--export_dir", out)
    assert_one_line_error(done, f"{narrow_adapter} does not fit the base {tiny_model_dir}: "
                                "model.layers.0.self_attn.q_proj is 64x64", "(32, 4)", "export it against that base")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nor a temporary file


@pytest.mark.parametrize("export_format", ["hf", "gguf"])
def test_merging_an_adapter_for_another_base_size_is_one_line(narrow_adapter, tiny_model_dir, tmp_path,
                                                              export_format):
    done = gym_here("export", "--model_name_or_path", tiny_model_dir, "--adapter_name_or_path", narrow_adapter,
                    "--format", export_format, "--export_dir", tmp_path / "out")
    assert_one_line_error(done, f"The adapter {narrow_adapter} does not fit the base {tiny_model_dir} (size mismatch",
                          "It was trained on", "pass --model_name_or_path")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("flag", "named"), [("--export_sise", "--export_size"), ("--formt", "--format"),
                                             ("--export_overwite", "--export_overwrite")])
def test_a_misspelt_export_flag_names_the_export_option_before_anything_loads(tiny_model_dir, tmp_path, capfd,
                                                                                flag, named):
    done = gym_here("export", f"model_name_or_path={tiny_model_dir}", "--export_dir", tmp_path / "out", flag, "2",
                    capfd=capfd)
    assert_one_line_error(done, f"Did you mean '{named}'?")
    assert "[gym]" not in done.stderr and not (tmp_path / "out").exists()


@pytest.mark.parametrize("export_format", ["gguf", "ollama"])
def test_an_architecture_gguf_cannot_hold_is_refused_before_its_weights_load(tokenizer, tmp_path, export_format):
    # Only the config: the refusal came once the whole model had loaded and merged (minutes for a 7B model).
    from transformers import GPT2Config

    model = tmp_path / "gpt2"
    GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2).save_pretrained(model)
    tokenizer.save_pretrained(model)
    done = gym_here("export", model, "--format", export_format, "--export_dir", tmp_path / "out")
    assert_one_line_error(done, "this one is 'gpt2'. Export it with --format hf.")
    assert not (tmp_path / "out").exists()
