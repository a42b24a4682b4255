"""Known failures of the machine and of the libraries reach the user as one line and exit status 2, from
every verb: a model folder without a tokenizer, an unreadable config.json, a broken safetensors file, a
full disk. `--debug` still shows the traceback; a bug (anything not known) keeps its traceback."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

import pytest
from tests.gym_cli import assert_one_line_error, gym_here, gym_process

from gym.cli import main
from gym.core.errors import ModelError, OutputError, as_gym_error


@pytest.fixture()
def untokenized(tiny_model_dir, tmp_path) -> Path:
    """The tiny base saved without its tokenizer files (weights and config only)."""
    folder = tmp_path / "no-tokenizer"
    folder.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        if (tiny_model_dir / name).is_file():
            shutil.copy(tiny_model_dir / name, folder / name)
    return folder


def test_compressing_without_calibration_needs_no_tokenizer(untokenized, make_finetune, tmp_path, capfd):
    tuned = make_finetune(lambda name, p: p.add_(0.01) if "mlp" in name else None)
    out = tmp_path / "d.safetensors"
    proc = gym_here("delta", "compress", "--base", untokenized, "--finetuned", tuned, "--method", "bitdelta",
                    "--distill-steps", "0", "-o", out, capfd=capfd)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert out.is_file()


def test_a_missing_tokenizer_is_one_line(untokenized, make_finetune, tmp_path, data_dir, capfd):
    tuned = make_finetune(lambda name, p: p.add_(0.01) if "mlp" in name else None)
    proc = gym_here("delta", "compress", "--base", untokenized, "--finetuned", tuned, "--method", "bitdelta",
                    "--distill-steps", "2", "--calibration", "tiny_alpaca", "--dataset-dir", data_dir,
                    "-o", tmp_path / "d.safetensors", capfd=capfd)
    assert_one_line_error(proc, "Could not load the tokenizer", str(untokenized))
    assert not (tmp_path / "d.safetensors").exists()


def test_an_unreadable_config_json_is_one_line(untokenized, tmp_path):
    (untokenized / "config.json").write_text("{not json")
    # A real process: one of these shows what a shell sees.
    proc = gym_process("delta", "compress", "--base", untokenized, "--finetuned", untokenized, "--method", "int8",
                       "-o", tmp_path / "d.safetensors")
    assert_one_line_error(proc, str(untokenized))


def test_a_truncated_safetensors_file_is_one_line(untokenized, tmp_path, capfd):
    weights = untokenized / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    proc = gym_here("delta", "compress", "--base", untokenized, "--finetuned", untokenized, "--method", "int8",
                    "-o", tmp_path / "d.safetensors", capfd=capfd)
    assert_one_line_error(proc, str(untokenized))


def test_a_full_disk_is_one_line_from_any_verb(monkeypatch, capsys, tmp_path):
    import gym.cli.delta as delta_cli

    def no_space(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "out"))

    monkeypatch.setattr(delta_cli, "write_applied", no_space)
    assert main(["delta", "apply", "--base", "b", "--delta", "d", "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("gym: error:") == 1 and "No space left on the device" in err and str(tmp_path / "out") in err
    with pytest.raises(OSError, match="No space left on device"):
        main(["delta", "apply", "--base", "b", "--delta", "d", "-o", str(tmp_path / "out"), "--debug"])


def test_ctrl_c_during_an_import_is_an_interrupt_not_a_traceback(monkeypatch, capsys):
    # Ctrl-C in the first second of a command cut transformers' lazy import of scipy short: an ImportError whose
    # context is the KeyboardInterrupt, printed as a traceback.
    import gym.cli as cli

    def import_cut_short(rest: list[str]) -> int:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as interrupt:
            raise ImportError("cannot import name 'linalg' from partially initialized module 'scipy'") from interrupt

    monkeypatch.setitem(cli.COMMANDS, "version", import_cut_short)
    assert main(["version"]) == 130
    assert capsys.readouterr().err.strip() == "gym: interrupted"
    with pytest.raises(ImportError):
        main(["version", "--debug"])


def test_a_bug_keeps_its_traceback(monkeypatch):
    import gym.cli.delta as delta_cli

    monkeypatch.setattr(delta_cli, "write_applied", lambda *a, **k: [][1])
    with pytest.raises(IndexError, match="list index out of range"):
        main(["delta", "apply", "--base", "b", "--delta", "d", "-o", "out"])


@pytest.mark.parametrize(("exc", "kind", "fragment"), [
    (OSError(errno.ENOSPC, "No space left on device", "/data/x"), OutputError, "No space left on the device (/data/x)"),
    (OSError(errno.EROFS, "Read-only file system", "/ro/x"), OutputError, "Permission denied (/ro/x)"),
    (PermissionError(errno.EACCES, "Permission denied", "/root/x"), OutputError, "Permission denied (/root/x)"),
    (type("SafetensorError", (Exception,), {})("Error while deserializing header"), ModelError, "safetensors"),
    # tokenizers' Rust error carries the system's words, not an errno
    (Exception("No space left on device (os error 28)"), OutputError, "No space left on the device."),
])
def test_known_failures_are_translated(exc, kind, fragment):
    error = as_gym_error(exc)
    assert isinstance(error, kind) and fragment in str(error)


@pytest.mark.parametrize("exc", [ValueError("a bug"), KeyError("x"), OSError(errno.EBADF, "Bad file descriptor")])
def test_other_failures_are_not_translated(exc):
    assert as_gym_error(exc) is None
