"""Outputs in hostile places (issue #39): a parent that is a file, an output that is or holds an input, and
--overwrite on a folder Gym did not write. Every writer goes through gym.core.files, so the rules are tested there
once, then through each command that writes: exit status 2, one `gym: error:` line naming the path, no traceback,
and nothing written or deleted."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from tests.gym_cli import gym_here, gym_process

from gym.core.errors import OutputError
from gym.core.files import (
    MANIFEST_FILE,
    PACKED_FOLDER,
    OutputLock,
    check_free_space,
    install_folder,
    make_folder,
    refuse_output_over_input,
    refuse_overwrite,
    temp_path,
    write_manifest,
)


@pytest.fixture()
def blocker(tmp_path) -> Path:
    """A regular file where an output path needs a folder."""
    path = tmp_path / "notes.txt"
    path.write_text("the user's notes")
    return path


# -- the rules, on their own -------------------------------------------------------------------------------------
def test_every_helper_names_a_parent_that_is_a_file(blocker):
    deep = blocker / "a" / "b" / "out"
    for call in (lambda: temp_path(blocker / "x.json"), lambda: temp_path(deep),
                 lambda: refuse_overwrite(blocker / "out", overwrite=True, folder=True),
                 lambda: refuse_overwrite(deep, overwrite=False),
                 lambda: check_free_space(deep, 10), lambda: make_folder(deep),
                 lambda: OutputLock(blocker / "run").acquire(), lambda: OutputLock(deep, file=True).acquire()):
        with pytest.raises(OutputError, match=f"its parent {blocker} is a file, not a folder"):
            call()
    with pytest.raises(OutputError, match=f"{blocker} is a file, not a folder"):
        make_folder(blocker)
    assert blocker.read_text() == "the user's notes"


def test_a_broken_link_on_the_way_is_named_too(tmp_path):
    link = tmp_path / "gone"
    link.symlink_to(tmp_path / "nowhere")
    with pytest.raises(OutputError, match=f"its parent {link} is a broken link"):
        temp_path(link / "x")


def test_an_output_that_is_or_holds_an_input_is_refused(tmp_path):
    model = tmp_path / "exports" / "model"
    model.mkdir(parents=True)
    with pytest.raises(OutputError, match="holds the input"):
        refuse_output_over_input(tmp_path / "exports", [model])
    with pytest.raises(OutputError, match="is the input"):
        refuse_output_over_input(model, ["smollm2-135m", model])
    (tmp_path / "link").symlink_to(model)
    with pytest.raises(OutputError, match="is the input"):
        refuse_output_over_input(tmp_path / "link", [model])  # the same folder, however it is written
    refuse_output_over_input(model / "export", [model])  # inside an input: it replaces only itself
    refuse_output_over_input(tmp_path / "exports-2", [model, "HuggingFaceTB/SmolLM2-135M", None])


def test_overwrite_replaces_only_a_folder_whose_manifest_lists_everything_in_it(tmp_path):
    out = tmp_path / "export"
    out.mkdir()
    (out / "model.safetensors").write_text("weights")
    (out / "tokenizer").mkdir()
    (out / "tokenizer" / "vocab.json").write_text("{}")
    write_manifest(out, {"what": "model"})
    assert json.loads((out / MANIFEST_FILE).read_text())["files"] == ["model.safetensors", "tokenizer/vocab.json"]
    refuse_overwrite(out, overwrite=True, folder=True)  # Gym's own folder: replaced
    (out / PACKED_FOLDER).mkdir()  # the fast engine's packed weights, left by serving the output at int8
    (out / PACKED_FOLDER / "int8-0123.safetensors").write_text("packed")
    refuse_overwrite(out, overwrite=True, folder=True)  # Gym's own cache: still replaced

    (out / "README.md").write_text("my notes")
    (out / "mine").mkdir()
    (out / "mine" / "a.txt").write_text("a")
    with pytest.raises(OutputError, match=r"holds mine and 1 more, which Gym did not write there"):
        refuse_overwrite(out, overwrite=True, folder=True)

    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "model.safetensors").write_text("someone else's model")
    with pytest.raises(OutputError, match=f"is not a folder Gym wrote \\(it has no {MANIFEST_FILE}"):
        refuse_overwrite(plain, overwrite=True, folder=True)
    (plain / MANIFEST_FILE).write_text('{"what": "model"}')  # written before manifests listed their files
    with pytest.raises(OutputError, match="is not a folder Gym wrote"):
        refuse_overwrite(plain, overwrite=True, folder=True)


def test_install_folder_keeps_the_old_output_until_the_new_one_is_in_place(tmp_path, monkeypatch):
    out, new = tmp_path / "out", tmp_path / ".out.tmp-1"
    for folder, text in ((out, "old"), (new, "new")):
        folder.mkdir()
        (folder / "w").write_text(text)
        write_manifest(folder, {})
    real_replace = os.replace

    def failing(src, dst):
        if Path(src) == new:
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(OSError):
        install_folder(new, out, overwrite=True)
    assert (out / "w").read_text() == "old"  # moved back
    monkeypatch.setattr(os, "replace", real_replace)
    install_folder(new, out, overwrite=True)
    assert (out / "w").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the old one is gone, nothing else left


# -- every command that writes, with a parent that is a file -----------------------------------------------------
def _merge_config(tmp_path: Path, model: Path, output: Path) -> Path:
    path = tmp_path / "merge.yaml"
    path.write_text(yaml.safe_dump({"merge_method": "linear", "models": [{"model": str(model)}] * 2,
                                    "output_dir": str(output)}))
    return path


def _tfgrpo_config(tmp_path: Path, output: Path) -> Path:
    (tmp_path / "queries.json").write_text(json.dumps([{"question": f"q{i}", "answer": "1"} for i in range(4)]))
    path = tmp_path / "tfgrpo.yaml"
    path.write_text(yaml.safe_dump({"model": "scripted", "base_url": "http://127.0.0.1:9/v1", "api_key": "k",
                                    "dataset": str(tmp_path / "queries.json"), "reward_funcs": "accuracy",
                                    "output_dir": str(output)}))
    return path


COMMANDS = {
    "export hf": lambda t, m, b: ["export", "--model_name_or_path", m, "--export_dir", b / "export"],
    "export gguf": lambda t, m, b: ["export", "--model_name_or_path", m, "--format", "gguf", "--export_dir",
                                    b / "sub" / "model.gguf"],
    "export gguf folder": lambda t, m, b: ["export", "--model_name_or_path", m, "--format", "gguf", "--export_dir",
                                           b / "gguf"],
    "merge": lambda t, m, b: ["merge", _merge_config(t, m, b / "merged")],
    "eval -o": lambda t, m, b: ["eval", "--model_name_or_path", m, "--task", "mc_demo", "-o", b / "results.json"],
    "tfgrpo train": lambda t, m, b: ["tfgrpo", "train", _tfgrpo_config(t, b / "run")],
    "delta compress -o": lambda t, m, b: ["delta", "compress", "--base", m, "--finetuned", m, "--method", "int8",
                                          "-o", b / "d.safetensors"],
    "delta apply -o": lambda t, m, b: ["delta", "apply", "--base", m, "--delta", t / "d.safetensors", "-o",
                                       b / "model"],
    "variants add": lambda t, m, b: ["variants", "add", b / "store", "--user", "alice", "--delta",
                                     t / "d.safetensors"],
    "soup init": lambda t, m, b: ["soup", "init", b / "soup", "--base", m],
}


@pytest.mark.parametrize("command", COMMANDS)
def test_an_output_under_a_file_is_one_line_and_exit_2(command, tmp_path, blocker, tiny_model_dir):
    done = gym_here(*COMMANDS[command](tmp_path, tiny_model_dir, blocker))
    errors = [line for line in done.stderr.splitlines() if line.startswith("gym: error:")]
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and len(errors) == 1, done.stderr
    assert f"{blocker} is a file, not a folder" in errors[0]
    assert blocker.read_text() == "the user's notes"
    assert not [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name]


@pytest.mark.slow  # a Python that imports torch: ~15 s on a busy machine
def test_as_a_real_process_too(tmp_path, blocker, tiny_model_dir):
    done = gym_process("export", "--model_name_or_path", tiny_model_dir, "--export_dir", blocker / "export")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (f"gym: error: Cannot write {blocker / 'export'}: its parent "
                                                    f"{blocker} is a file, not a folder. Choose another path.")
