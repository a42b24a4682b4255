"""The output rules every writer shares (gym.core.files): ownership, stale temporary files, overwrite, space."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from gym.core.errors import OutputError
from gym.core.files import (
    LOCK_FILE,
    OutputLock,
    check_free_space,
    readable_as_umask,
    refuse_overwrite,
    remove_stale_temps,
    temp_path,
)


def _dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)


def test_one_owner_at_a_time(tmp_path):
    with OutputLock(tmp_path / "out", what="gym train") as lock:
        owner = json.loads(lock.path.read_text())
        assert owner["pid"] == os.getpid() and owner["host"] == socket.gethostname()
        with pytest.raises(OutputError, match=rf"in use by another Gym process \(gym train, pid {os.getpid()}"):
            OutputLock(tmp_path / "out").acquire()
    assert not (tmp_path / "out" / LOCK_FILE).exists()
    assert not (tmp_path / "out").exists()  # made only for the lock, and left empty: removed with it


def test_a_dead_owner_or_a_half_written_lock_is_stale(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_FILE).write_text(json.dumps({"pid": _dead_pid(), "host": socket.gethostname()}))
    with OutputLock(out):
        pass
    (out / LOCK_FILE).write_text('{"pid": 12')  # its owner died while writing it
    with OutputLock(out):
        pass


def test_another_hosts_lock_is_respected(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_FILE).write_text(json.dumps({"pid": 1, "host": "another-machine", "since": "today"}))
    with pytest.raises(OutputError, match="pid 1 on another-machine"):
        OutputLock(out).acquire()


def test_a_file_output_is_locked_beside_it(tmp_path):
    target = tmp_path / "preds.jsonl"
    with OutputLock(target, file=True):
        assert (tmp_path / ".preds.jsonl.gym-lock").is_file()
        with pytest.raises(OutputError, match="preds.jsonl is in use"):
            OutputLock(target, file=True).acquire()


def test_only_temporary_files_of_dead_writers_are_removed(tmp_path):
    dead = _dead_pid()
    mine = temp_path(tmp_path / "d.safetensors")
    mine.write_text("in progress")
    (tmp_path / f".d.safetensors.tmp-{dead}").write_text("left by a killed run")
    (tmp_path / f".final.tmp-{dead}").mkdir()
    (tmp_path / f".other.tmp-{os.getppid()}").write_text("a live process's")
    (tmp_path / "d.safetensors").write_text("finished")
    removed = remove_stale_temps(tmp_path)
    assert sorted(p.name for p in removed) == sorted([f".d.safetensors.tmp-{dead}", f".final.tmp-{dead}"])
    assert mine.exists() and (tmp_path / f".other.tmp-{os.getppid()}").exists()
    assert (tmp_path / "d.safetensors").exists()


def test_existing_work_is_replaced_only_when_asked(tmp_path):
    file, folder, empty = tmp_path / "f", tmp_path / "model", tmp_path / "empty"
    file.write_text("x")
    folder.mkdir()
    (folder / "model.safetensors").write_text("x")
    empty.mkdir()
    with pytest.raises(OutputError, match="already exists .* pass --overwrite"):
        refuse_overwrite(file, overwrite=False)
    with pytest.raises(OutputError, match="already exists \\(a folder\\)"):
        refuse_overwrite(folder, overwrite=False, folder=True)
    with pytest.raises(OutputError, match="is a file, and this output is a folder"):
        refuse_overwrite(file, overwrite=True, folder=True)
    with pytest.raises(OutputError, match="is a folder, and this output is a file"):
        refuse_overwrite(folder, overwrite=True)
    refuse_overwrite(file, overwrite=True)
    refuse_overwrite(empty, overwrite=False, folder=True)  # an empty folder holds no work
    refuse_overwrite(tmp_path / "new", overwrite=False)


def test_free_space_is_checked_before_writing(tmp_path):
    check_free_space(tmp_path / "small", 1024)
    with pytest.raises(OutputError, match=r"No space left on the device of .*needs ~[\d.]+ TB, .* is free"):
        check_free_space(tmp_path / "not" / "yet" / "there", 2**60)


def test_outputs_are_readable_as_the_umask_says_though_safetensors_writes_0600(tmp_path):
    """safetensors' save_file leaves its file 0600: a model folder shared with another user could not be read.
    readable_as_umask adds what the umask allows, and never takes a bit away."""
    from safetensors.torch import save_file

    old = os.umask(0o022)
    try:
        folder = tmp_path / "model"
        folder.mkdir()
        save_file({"w": torch.zeros(2)}, str(folder / "model.safetensors"))
        (folder / "private.txt").write_text("x")
        (folder / "private.txt").chmod(0o700)
        assert (folder / "model.safetensors").stat().st_mode & 0o777 == 0o600  # what the library does
        readable_as_umask(folder)
        assert (folder / "model.safetensors").stat().st_mode & 0o777 == 0o644
        assert (folder / "private.txt").stat().st_mode & 0o777 == 0o744  # bits added, the owner's x kept
    finally:
        os.umask(old)
