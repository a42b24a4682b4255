"""Names of the files Gym writes, and the rules every writer follows so that finished work is never lost.

- **Atomic**: an artefact (a trained output, a checkpoint, a delta, a converted model) is written
  under a temporary name beside its final path and renamed into place, so a crash never leaves half
  a file where a finished one is expected. Temporary names carry the writer's pid
  (`.NAME.tmp-PID`), so the next run on the same output removes what a killed run left behind.
- **Owned**: one live run owns an output (`OutputLock`: a lock file with its pid, host and start);
  a second run fails at once, naming the owner; a lock whose process is gone is stale and replaced.
- **No silent overwrite**: an existing output is replaced only when the user says so
  (`refuse_overwrite`), and then only if Gym wrote it: a folder is replaced whole only while it holds nothing
  but the files its `gym_manifest.json` lists (`write_manifest` records them), so `--overwrite` never deletes
  a user's own files, and the old folder goes only once the new one is in place (`install_folder`).
- **Never over an input**: an output that is, or holds, what the job reads is refused
  (`refuse_output_over_input`): replacing it would delete the input.
- **Paths checked before the work**: a parent that is a file is named in one line (`refuse_file_in_path`,
  called by every helper here) rather than surfacing as "Not a directory" from deep inside a writer.
- **Space checked first** where the size is known (`check_free_space`).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

from gym.core.errors import OutputError

CONFIG_FILE = "gym_config.yaml"  # the resolved config a run was made with
MANIFEST_FILE = "gym_manifest.json"  # present only in a finished output: what it is, from which base
LOG_FILE = "trainer_log.jsonl"  # one JSON object per logged step
LOCK_FILE = ".gym-lock"  # in an output folder: the live run that owns it
# In a model folder: the fast engine's packed int8/int4 weights (gym.infer.fast.pack_cache), a cache Gym rebuilds.
PACKED_FOLDER = ".gym-packed"
FORMAT_VERSION = 1

_TEMP = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<pid>\d+)$")

PathLike = str | os.PathLike[str]


def refuse_file_in_path(path: PathLike, folder: bool = False, action: str = "write") -> None:
    """An OutputError when a folder on the way to `path` is a file (or a link to nothing), so that nothing can be
    made there; with `folder`, also when `path` itself, which is to be a folder, is a file. The OS would report it
    only as "Not a directory" or "File exists" from deep inside whichever writer met it first."""
    path = Path(path)
    if folder and os.path.lexists(path) and not path.is_dir():
        raise OutputError(f"{path} is a file, not a folder; choose another path.")
    for parent in path.parents:  # nearest first; the first that exists decides
        if os.path.lexists(parent):
            if not parent.is_dir():
                what = "a broken link" if parent.is_symlink() else "a file"
                raise OutputError(f"Cannot {action} {path}: its parent {parent} is {what}, not a folder. "
                                  "Choose another path.")
            return


def make_folder(path: PathLike) -> Path:
    """`mkdir -p path`, or an OutputError naming the file in the way."""
    path = Path(path)
    refuse_file_in_path(path, folder=True)
    path.mkdir(parents=True, exist_ok=True)
    return path


def temp_path(final: PathLike) -> Path:
    """The hidden sibling of `final` this process writes before the rename: `.NAME.tmp-PID`. Every atomic writer
    asks for one first, so a parent that is a file is reported here, before anything is written."""
    final = Path(final)
    refuse_file_in_path(final)
    return final.with_name(f".{final.name}.tmp-{os.getpid()}")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def readable_as_umask(path: PathLike) -> None:
    """Give a file (or every file under a folder) the permissions the umask gives a new file, where it has fewer:
    safetensors writes its files 0600 (via a private temporary file), so a model, adapter or delta folder shared
    with another user or a service account could not be read, unlike the config and tokenizer beside it. Bits
    are only added, never taken away; links are left alone."""
    wanted = 0o666 & ~_umask()
    path = Path(path)
    files = [path] if not path.is_dir() else [Path(root) / name for root, _, names in os.walk(path) for name in names]
    for file in files:
        if file.is_symlink():
            continue
        mode = file.stat().st_mode & 0o777
        if mode | wanted != mode:
            file.chmod(mode | wanted)


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
    place is an error either way (replacing a file with a folder is never what the user meant), and a folder is
    replaced only while everything in it is a file its manifest lists: the user's own files are never deleted."""
    path = Path(path)
    refuse_file_in_path(path)
    if folder and path.exists() and not path.is_dir():
        raise OutputError(f"{path} is a file, and this output is a folder; choose another path.")
    if not folder and path.is_dir():
        raise OutputError(f"{path} is a folder, and this output is a file; choose another path.")
    holds_work = path.is_file() or (path.is_dir() and any(path.iterdir()))
    if holds_work and not overwrite:
        kind = "folder" if path.is_dir() else "file"
        raise OutputError(f"{path} already exists (a {kind}); pass {how} to replace it, or choose another path.")
    if holds_work and path.is_dir():
        strangers = not_written_by_gym(path)
        if strangers is None:
            raise OutputError(f"{path} is not a folder Gym wrote (it has no {MANIFEST_FILE} listing its files), so "
                              f"{how} will not delete it; nothing in it was touched. Choose another path, or empty it "
                              "yourself.")
        if strangers:
            more = f" and {len(strangers) - 1} more" if len(strangers) > 1 else ""
            raise OutputError(f"{path} holds {strangers[0]}{more}, which Gym did not write there, so {how} will not "
                              "replace the folder; nothing in it was touched. Move it elsewhere, or choose another "
                              "path.")


def refuse_output_over_input(output: PathLike, inputs: Iterable[PathLike | None], how: str = "--overwrite") -> None:
    """An OutputError when `output` is one of `inputs`, or a folder that holds one: writing it would replace what
    the job reads (and `--overwrite` would delete it). Inputs that are not on this disk (hub ids, model names)
    cannot be hit and are skipped. An output inside an input folder replaces only itself, and is allowed."""
    target = Path(output).expanduser().resolve()
    for given in inputs:
        if not given:
            continue
        source = Path(given).expanduser()
        if not os.path.lexists(source):
            continue
        source = source.resolve()
        if source == target or target in source.parents:
            where = "is" if source == target else "holds"
            raise OutputError(f"The output {output} {where} the input {given}: writing it would replace what this "
                              f"command reads, {how} or not. Choose an output outside the inputs.")


def write_manifest(folder: PathLike, manifest: dict[str, Any], indent: int = 2) -> None:
    """`folder`'s gym_manifest.json, written last, with `files`: every file then in the folder. An overwrite
    later replaces the folder only while it holds nothing else (`refuse_overwrite`)."""
    folder = Path(folder)
    files = [name for name in _entries(folder)[0] if name != MANIFEST_FILE]
    (folder / MANIFEST_FILE).write_text(json.dumps({**manifest, "files": files}, indent=indent) + "\n",
                                        encoding="utf-8")


def manifest_files(folder: PathLike) -> list[str] | None:
    """The files `folder`'s manifest lists as Gym's (relative paths); None when no manifest lists them (a folder Gym
    did not write, or wrote before manifests listed them)."""
    try:
        listed = json.loads((Path(folder) / MANIFEST_FILE).read_text(encoding="utf-8")).get("files")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(listed, list) or not all(isinstance(name, str) for name in listed):
        return None
    return listed


def not_written_by_gym(folder: PathLike) -> list[str] | None:
    """What `folder` holds that its manifest does not list (relative paths, a foreign sub-folder once); None when
    no manifest lists its files (a folder Gym did not write, or wrote before manifests listed them)."""
    folder = Path(folder)
    listed = manifest_files(folder)
    if listed is None:
        return None
    # Serving a finished output at int8/int4 leaves the packed-weight cache in it: Gym's, and rebuilt on demand.
    owned = {*listed, MANIFEST_FILE, *(f"{PACKED_FOLDER}/{name}" for name in _cache_files(folder))}
    owned_folders = {parent.as_posix() for name in owned for parent in Path(name).parents if parent != Path(".")}
    files, folders = _entries(folder)
    strangers: list[str] = []
    for name, mine in [*((f, owned_folders) for f in folders), *((f, owned) for f in files)]:
        # a foreign folder is named once, not with everything in it
        if name not in mine and not any(name.startswith(f"{stranger}/") for stranger in strangers):
            strangers.append(name)
    return strangers


def _cache_files(folder: Path) -> list[str]:
    cache = folder / PACKED_FOLDER
    return [entry.name for entry in cache.iterdir()] if cache.is_dir() and not cache.is_symlink() else []


def _entries(folder: Path) -> tuple[list[str], list[str]]:
    """(files and links, sub-folders) under `folder`, as sorted relative POSIX paths; links are not followed."""
    files: list[str] = []
    folders: list[str] = []
    for root, dirs, names in os.walk(folder):
        here = Path(root).relative_to(folder)
        for name in dirs:  # a link to a folder is one entry (os.walk does not go into it), not a tree
            (files if (Path(root) / name).is_symlink() else folders).append((here / name).as_posix())
        files += [(here / name).as_posix() for name in names]
    return sorted(files), sorted(folders)


def install_folder(tmp: PathLike, out: PathLike, overwrite: bool, how: str = "--overwrite") -> Path:
    """Rename the finished folder `tmp` to `out`. An existing `out` is checked again (`refuse_overwrite`: another
    process may have put files there since the job began), moved aside, and deleted only once the new folder is
    in place, so a crash leaves the old output or the new one, never neither."""
    tmp, out = Path(tmp), Path(out)
    refuse_overwrite(out, overwrite, how, folder=True)
    readable_as_umask(tmp)
    if not os.path.lexists(out):
        os.replace(tmp, out)
        return out
    old = temp_path(out.with_name(f"{out.name}.old"))
    shutil.rmtree(old, ignore_errors=True)
    os.replace(out, old)
    try:
        os.replace(tmp, out)
    except BaseException:
        os.replace(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)
    return out


@contextmanager
def building_folder(out: PathLike, overwrite: bool, how: str = "--overwrite") -> Iterator[Path]:
    """An empty temporary folder beside `out` to build a finished output in. A clean exit installs it as `out`
    (install_folder: an existing `out` is replaced only as refuse_overwrite allows); an error removes it, and `out`
    is as it was."""
    out = Path(out)
    refuse_overwrite(out, overwrite, how, folder=True)
    make_folder(out.parent)
    remove_stale_temps(out.parent)
    tmp = temp_path(out)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        yield tmp
        install_folder(tmp, out, overwrite, how)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_free_space(path: PathLike, needed_bytes: int, margin: float = 1.1) -> None:
    """Fail before writing `needed_bytes` (times a margin for metadata) where the disk cannot hold them."""
    refuse_file_in_path(path)
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
        make_folder(self.folder)
        mine = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "what": self.what}
        if self.path.is_dir():
            raise OutputError(f"{self.path} is a folder, where Gym keeps its lock file; remove it.")
        for _ in range(3):
            try:
                self._create(mine)
            except FileExistsError:
                owner = self._owner()
                if owner is not None and self._alive(owner):
                    raise OutputError(
                        f"{self.output} is in use by another Gym process ({owner.get('what', 'a run')}, pid "
                        f"{owner.get('pid')} on {owner.get('host')}, since {owner.get('since')}). Wait for it to "
                        f"finish, or choose another output. If that process is gone, delete {self.path}.") from None
                self.path.unlink(missing_ok=True)  # stale: its owner is dead
                continue
            self.held = True
            return
        raise OutputError(f"Could not take {self.path}: other runs keep replacing it.")

    def _create(self, mine: dict[str, object]) -> None:
        """The lock file, appearing whole: written under a private name, then hard-linked to the lock's name, which
        fails if the lock exists. Created empty and then written, a lock read in between looked stale (no owner to
        ask) and was taken from a live run. Where hard links are not allowed, exclusive creation, as before."""
        private = self.path.with_name(f"{self.path.name}.{os.getpid()}.{threading.get_ident()}")
        private.write_text(json.dumps(mine), encoding="utf-8")
        try:
            os.link(private, self.path)
            return
        except FileExistsError:
            raise
        except OSError:  # no hard links on this file system
            pass
        finally:
            private.unlink(missing_ok=True)
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(mine, handle)

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
