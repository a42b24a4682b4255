"""A variant store: a folder of per-user deltas on one base model.

    <store>/
      store.json              the base: {"base": {"name", "fingerprint"}}, written by the first variant
      <user>/delta.safetensors   the user's compressed delta (gym.delta.format: BitDelta or DeltaQuant)
      <user>/adapter/            or: a LoRA adapter folder (adapter_config.json, adapter_model.safetensors)
      <user>/manifest.json       user, base, method, bytes, created, training keys, gain kept, seconds
      .locks/<user>             held while that user's variant is being created

A variant is written into a temporary folder inside the store and renamed into place, so a reader
sees a whole variant or none; a second create of the same user while one runs is refused (the lock
is an exclusively-created file), not interleaved. User ids are names, never paths. Every variant must
come from the store's base: a delta whose base fingerprint differs is refused, by name.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gym.core.errors import ConfigError, GymError
from gym.core.files import make_folder
from gym.delta.format import read_header
from gym.personalization.loading import deltas_from_adapter

DELTA_FILE = "delta.safetensors"
ADAPTER_DIR = "adapter"
MANIFEST = "manifest.json"
STORE_FILE = "store.json"
MAX_USER_ID = 128
_USER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]*")


class VariantError(GymError):
    """A variant that does not exist, cannot be created, or does not belong to this store."""


def check_user_id(user_id: str) -> str:
    """A user id is a name: letters, digits and . _ @ + -, starting with a letter or digit, at most 128
    characters, never '..' (so it can name a folder and never escape the store)."""
    if not isinstance(user_id, str) or not user_id:
        raise ConfigError(f"user id {user_id!r}: give a non-empty string.")
    if len(user_id) > MAX_USER_ID:
        raise ConfigError(f"user id {user_id[:40]!r}...: {len(user_id)} characters, at most {MAX_USER_ID}.")
    if not _USER_ID.fullmatch(user_id) or ".." in user_id:
        raise ConfigError(f"user id {user_id!r}: use letters, digits and . _ @ + - (starting with a letter or "
                          "digit, no '..', no path separators).")
    return user_id


@dataclass
class VariantRecord:
    """What create_variant returns and manifest.json holds."""

    user: str
    base: dict[str, str]
    method: str
    bytes: int
    created: str
    seconds: float
    training: dict[str, Any] = field(default_factory=dict)
    gain_kept: float | None = None  # on held-out rows of the user's own data, when there were enough
    losses: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class VariantStore:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser()

    # -- the base ----------------------------------------------------------------------------------
    def base(self) -> dict[str, str] | None:
        """The store's base ({"name", "fingerprint"}), or None while it holds no variant."""
        path = self.root / STORE_FILE
        if not path.is_file():
            return None
        try:
            return dict(json.loads(path.read_text())["base"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise VariantError(f"{path} is not a variant store's description ({exc}).") from None

    def check_base(self, base: dict[str, str], source: str) -> None:
        """Refuse a delta (`source`) made from another base than the store's."""
        mine = self.base()
        if mine is not None and mine.get("fingerprint") != base.get("fingerprint"):
            raise VariantError(f"{source} was made from base {base.get('name')!r}, and the store {self.root} holds "
                               f"variants of {mine.get('name')!r} (their base fingerprints differ).")

    # -- reading -----------------------------------------------------------------------------------
    def path(self, user_id: str) -> Path:
        return self.root / check_user_id(user_id)

    def delta_path(self, user_id: str) -> Path:
        return self.path(user_id) / DELTA_FILE

    def adapter_path(self, user_id: str) -> Path:
        return self.path(user_id) / ADAPTER_DIR

    def exists(self, user_id: str) -> bool:
        return (self.path(user_id) / MANIFEST).is_file()

    def get(self, user_id: str) -> VariantRecord:
        manifest = self.path(user_id) / MANIFEST
        if not manifest.is_file():
            known = self.users()
            hint = f" Variants here: {', '.join(known[:10])}{'...' if len(known) > 10 else ''}." if known else ""
            raise VariantError(f"No variant for user {user_id!r} in {self.root}.{hint}")
        try:
            return VariantRecord(**json.loads(manifest.read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise VariantError(f"{manifest} is unreadable: {exc}") from None

    def users(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if (p / MANIFEST).is_file() and _USER_ID.fullmatch(p.name))

    def list(self) -> list[VariantRecord]:
        return [self.get(user) for user in self.users()]

    # -- writing -----------------------------------------------------------------------------------
    @contextmanager
    def creating(self, user_id: str, *, replace: bool = False) -> Iterator[Path]:
        """A temporary folder to build `user_id`'s variant in (delta.safetensors and manifest.json); on a
        clean exit it is checked and renamed into place. A create of the same user already running is
        refused, and so is an existing variant unless `replace`."""
        check_user_id(user_id)
        locks = self.root / ".locks"
        make_folder(locks)  # a store path under a file: one line naming it, not NotADirectoryError
        lock = locks / user_id
        try:
            descriptor = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            raise VariantError(f"A variant for user {user_id!r} is being created in {self.root} already "
                               f"(lock {lock}); wait for it, or remove the lock if that process died.") from None
        os.write(descriptor, str(os.getpid()).encode())
        os.close(descriptor)
        temporary = self.root / f".tmp-{user_id}-{uuid.uuid4().hex[:8]}"
        try:
            if self.exists(user_id) and not replace:
                raise VariantError(f"User {user_id!r} already has a variant in {self.root}; delete it first "
                                   "(or pass replace=True).")
            temporary.mkdir()
            yield temporary
            self._commit(user_id, temporary)
        finally:
            shutil.rmtree(temporary, ignore_errors=True)
            lock.unlink(missing_ok=True)

    def _commit(self, user_id: str, folder: Path) -> None:
        if not (folder / MANIFEST).is_file():
            raise VariantError(f"{folder} has no {MANIFEST}.")
        if (folder / ADAPTER_DIR).is_dir():  # a LoRA adapter carries no base fingerprint; shapes are checked on load
            pass
        else:
            header = read_header(folder / DELTA_FILE)  # a whole, readable delta file or an error naming it
            base = dict(header.get("base", {}))
            self.check_base(base, str(folder / DELTA_FILE))
            if self.base() is None:
                _write_json(self.root / STORE_FILE, {"base": base})
        target = self.path(user_id)
        if target.exists():  # replace: the old variant leaves only once the new one is complete
            old = self.root / f".old-{user_id}-{uuid.uuid4().hex[:8]}"
            target.rename(old)
            folder.rename(target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            folder.rename(target)

    def add(self, user_id: str, *, delta: str | os.PathLike[str] | None = None,
            adapter: str | os.PathLike[str] | None = None, replace: bool = False) -> VariantRecord:
        """Put an existing variant in the store: a Gym delta file (`gym delta compress`: BitDelta or
        DeltaQuant) or a LoRA adapter folder, checked and copied whole."""
        if (delta is None) == (adapter is None):
            raise ConfigError("Give the variant as a delta file (delta=) or a LoRA adapter folder (adapter=): one.")
        given = delta if delta is not None else adapter
        assert given is not None
        source = Path(given).expanduser()
        with self.creating(user_id, replace=replace) as folder:
            if delta is not None:
                header = read_header(source)
                self.check_base(dict(header.get("base", {})), str(source))
                shutil.copyfile(source, folder / DELTA_FILE)
                method, base = str(header.get("method")), dict(header.get("base", {}))
            else:
                for name in ("adapter_config.json", "adapter_model.safetensors"):
                    if not (source / name).is_file():
                        raise ConfigError(f"{source} is not a LoRA adapter folder: it has no {name}.")
                (folder / ADAPTER_DIR).mkdir()
                for name in ("adapter_config.json", "adapter_model.safetensors"):
                    shutil.copyfile(source / name, folder / ADAPTER_DIR / name)
                deltas_from_adapter(folder / ADAPTER_DIR)  # a plain LoRA the engine can serve, or a clear error
                method, base = "lora", self.base() or {}
            size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
            record = VariantRecord(user=user_id, base=base, method=method, bytes=size, created=now(), seconds=0.0,
                                   training={"added_from": str(source)})
            write_manifest(folder, record)
        return record

    def delete(self, user_id: str) -> None:
        target = self.path(user_id)
        if not (target / MANIFEST).is_file():
            raise VariantError(f"No variant for user {user_id!r} in {self.root}.")
        # Renamed first, so a reader never sees half a variant; the files go after.
        doomed = self.root / f".deleted-{user_id}-{uuid.uuid4().hex[:8]}"
        target.rename(doomed)
        shutil.rmtree(doomed, ignore_errors=True)


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _write_json(path: Path, value: Any) -> None:
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    temporary.write_text(json.dumps(value, indent=2) + "\n")
    temporary.replace(path)


def write_manifest(folder: Path, record: VariantRecord) -> None:
    _write_json(folder / MANIFEST, record.to_json())


def variant_source(reference: str) -> tuple[str, str]:
    """(the variant's delta file, its base model) for STORE:USER, as export and eval take a variant."""
    folder, _, user = reference.rpartition(":")
    store = VariantStore(folder)
    store.get(user)  # a missing user is a clear error naming the known ones
    base = (store.base() or {}).get("name") or "smollm2-135m"
    return str(store.delta_path(user)), base
