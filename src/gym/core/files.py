"""Names of the files Gym writes, and the rules every writer follows so that finished work is never lost.

- **Atomic**: an artefact (a trained output, a checkpoint, a delta, a converted model) is written
  under a temporary name beside its final path and renamed into place, so a crash never leaves half
  a file where a finished one is expected. Temporary names carry the writer's pid
  (`.NAME.tmp-PID`), so the next run on the same output removes what a killed run left behind.
- **Owned**: one live run owns an output (`OutputLock`: a lock file with its pid, host and start);
  a second run fails at once, naming the owner; a lock whose process is gone is stale and replaced.
- **No silent overwrite**: an existing output is replaced only when the user says so
  (`refuse_overwrite`).
- **Space checked first** where the size is known (`check_free_space`).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import socket
import time
from pathlib import Path
from types import TracebackType

from gym.core.errors import OutputError

CONFIG_FILE = "gym_config.yaml"  # the resolved config a run was made with
MANIFEST_FILE = "gym_manifest.json"  # present only in a finished output: what it is, from which base
LOG_FILE = "trainer_log.jsonl"  # one JSON object per logged step
LOCK_FILE = ".gym-lock"  # in an output folder: the live run that owns it
FORMAT_VERSION = 1

_TEMP = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<pid>\d+)$")

PathLike = str | os.PathLike[str]


def temp_path(final: PathLike) -> Path:
    """The hidden sibling of `final` this process writes before the rename: `.NAME.tmp-PID`."""
    final = Path(final)
    return final.with_name(f".{final.name}.tmp-{os.getpid()}")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, but belongs to someone else
        return True
    return True


def remove_stale_temps(folder: PathLike) -> list[Path]:
    """Delete the temporary files and folders in `folder` whose writer (by the pid in the name) is gone."""
    folder = Path(folder)
    removed: list[Path] = []
    if not folder.is_dir():
        return removed
    for entry in folder.iterdir():
        match = _TEMP.match(entry.name)
        if match and int(match["pid"]) != os.getpid() and not pid_alive(int(match["pid"])):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


def refuse_overwrite(path: PathLike, overwrite: bool, how: str = "--overwrite", folder: bool = False) -> None:
    """Existing work at `path` is replaced only when `overwrite` is set; else an OutputError that says how
    to allow it. An empty folder holds no work. With `folder`, the output is a folder, so a file in its
    place is an error either way (replacing a file with a folder is never what the user meant)."""
    path = Path(path)
    if folder and path.exists() and not path.is_dir():
        raise OutputError(f"{path} is a file, and this output is a folder; choose another path.")
    if not folder and path.is_dir():
        raise OutputError(f"{path} is a folder, and this output is a file; choose another path.")
    holds_work = path.is_file() or (path.is_dir() and any(path.iterdir()))
    if holds_work and not overwrite:
        kind = "folder" if path.is_dir() else "file"
        raise OutputError(f"{path} already exists (a {kind}); pass {how} to replace it, or choose another path.")


def check_free_space(path: PathLike, needed_bytes: int, margin: float = 1.1) -> None:
    """Fail before writing `needed_bytes` (times a margin for metadata) where the disk cannot hold them."""
    probe = Path(path).resolve()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if needed_bytes * margin > free:
        raise OutputError(f"No space left on the device of {path}: writing it needs ~{human_bytes(needed_bytes)}, "
                          f"{human_bytes(free)} is free. Free some space or write elsewhere.")


def human_bytes(n: float) -> str:
    """1234567 -> '1.2 MB' (powers of 1000, as disks are sold)."""
    units = ["B", "KB", "MB", "GB", "TB"]
    power = min(int(math.log(max(n, 1), 1000)), len(units) - 1)
    return f"{n / 1000**power:.1f} {units[power]}" if power else f"{int(n)} B"


class OutputLock:
    """`with OutputLock(output):` -- this process owns `output` (a folder, or with `file=True` a file) until
    the block ends. Another live owner (same host and pid alive, or another host) is an OutputError naming
    it; a dead owner's lock is replaced."""

    def __init__(self, output: PathLike, what: str = "run", file: bool = False) -> None:
        output = Path(output)
        self.folder = output.parent if file else output
        self.path = output.with_name(f".{output.name}.gym-lock") if file else output / LOCK_FILE
        self.output = output
        self.what = what
        self.held = False
        self.created = False

    def _owner(self) -> dict[str, object] | None:
        try:
            owner = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return None  # vanished, or half written by an owner that died while writing it
        return owner if isinstance(owner, dict) else None

    def acquire(self) -> None:
        self.created = not self.folder.exists()  # a folder made only to hold the lock is removed with it
        self.folder.mkdir(parents=True, exist_ok=True)
        mine = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "what": self.what}
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                owner = self._owner()
                if owner is not None and self._alive(owner):
                    raise OutputError(
                        f"{self.output} is in use by another Gym {owner.get('what', 'run')} (pid {owner.get('pid')} "
                        f"on {owner.get('host')}, since {owner.get('since')}). Wait for it to finish, or choose "
                        f"another output. If that process is gone, delete {self.path}.") from None
                self.path.unlink(missing_ok=True)  # stale: its owner is dead
                continue
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(mine, handle)
            self.held = True
            return
        raise OutputError(f"Could not take {self.path}: other runs keep replacing it.")

    @staticmethod
    def _alive(owner: dict[str, object]) -> bool:
        pid = owner.get("pid")
        if owner.get("host") != socket.gethostname():
            return True  # another machine's process: we cannot tell, so it owns the folder
        return isinstance(pid, int) and pid_alive(pid)

    def release(self) -> None:
        if self.held:
            owner = self._owner()
            if owner is not None and owner.get("pid") == os.getpid():
                self.path.unlink(missing_ok=True)
            self.held = False
            if self.created and self.folder.is_dir() and not any(self.folder.iterdir()):
                self.folder.rmdir()  # the run failed before writing anything: leave no empty output behind

    def __enter__(self) -> OutputLock:
        self.acquire()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.release()
