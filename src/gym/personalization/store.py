"""A variant store: a folder of per-user variants of one base model.

    <store>/
      store.json                the base: {"base": {"name", "fingerprint", "parameters"}, "shapes": {...}},
                                made (exclusively) by the first variant
      <user> -> .versions/<user>/<version>    a link to the user's current variant, holding:
          delta.safetensors     the user's compressed delta (gym.delta.format: BitDelta or DeltaQuant)
          adapter/              or: a LoRA adapter folder (adapter_config.json, adapter_model.safetensors)
          manifest.json         user, base, method, bytes, created, training keys, gain kept, seconds
      .<user>.gym-lock          held (pid and host) while that user's variant is written or deleted (<user> in
                                lower case: ids that differ only in case share it)
      .<user>.tmp-<pid>/        a variant being built by process <pid>

A variant is built in a temporary folder, read whole and checked (every tensor finite, every changed
parameter one of the base's with its shape, the base's fingerprint) and becomes a new version; the user's link
is switched to it by one rename, so a reader finds the old variant or the new one, never none. The version
before stays until the next write of that user, for a reader that followed the link just before the switch.
One writer per user: a second is refused while the first lives; a killed writer's lock is taken over and its
temporary folder removed (gym.core.files). User ids are names, never paths, and a new one may not equal an
existing one ignoring case (`Alice` beside `alice`): on a case-insensitive filesystem (macOS, Windows) the two
would be one folder, so one user's write would replace the other's variant. The store's base is set by its first
variant, exclusively (of two first variants at once, one makes store.json and the other is checked against it);
a variant of another base is refused by name.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gym.core.errors import ConfigError, GymError, OutputError
from gym.core.files import OutputLock, refuse_file_in_path, remove_stale_temps, temp_path

# The user id rule lives in core: the service (keys, files) names the same users without loading the store's
# torch-backed readers. Re-exported here, where variant code has always imported it.
from gym.core.names import MAX_USER_ID, USER_ID_PATTERN, check_user_id  # noqa: F401
from gym.infer.fast.deltas import ParamDelta
from gym.personalization.base import Shapes, adapter_base, base_shapes, check_shapes, describe_base
from gym.personalization.loading import deltas_from_adapter, deltas_from_file

DELTA_FILE = "delta.safetensors"
ADAPTER_DIR = "adapter"
MANIFEST = "manifest.json"
STORE_FILE = "store.json"
VERSIONS = ".versions"


class VariantError(GymError):
    """A variant that does not exist, cannot be created, or does not belong to this store."""


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
    safety_gate: dict[str, Any] | None = None  # the safety gate's decision and numbers (gym.safety.gate), if gated

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class VariantStore:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser()

    # -- the base ----------------------------------------------------------------------------------
    def _description(self) -> dict[str, Any] | None:
        path = self.root / STORE_FILE
        if not path.is_file():
            return None
        try:
            description = json.loads(path.read_text())
            description["base"] = dict(description["base"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise VariantError(f"{path} is not a variant store's description ({exc}).") from None
        return dict(description)

    def base(self) -> dict[str, str] | None:
        """The store's base ({"name", "fingerprint", "parameters"}), or None while it holds no variant."""
        description = self._description()
        return None if description is None else description["base"]

    def base_shapes(self) -> Shapes | None:
        """The shape of every parameter of the store's base (None while it has none). A store made before they
        were kept has them read from its base model's config."""
        description = self._description()
        if description is None:
            return None
        shapes = description.get("shapes")
        if isinstance(shapes, dict):
            return shapes
        return base_shapes(description["base"].get("name"), str(self.root / STORE_FILE))

    def check_base(self, base: dict[str, str], source: str) -> None:
        """Refuse a delta (`source`) made from another base than the store's."""
        mine = self.base()
        if mine is not None and mine.get("fingerprint") != base.get("fingerprint"):
            raise VariantError(f"{source} was made from base {base.get('name')!r}, and the store {self.root} holds "
                               f"variants of {mine.get('name')!r} (their base fingerprints differ).")

    def check_variant(self, deltas: dict[str, ParamDelta], base: dict[str, str], source: str) -> Shapes:
        """A variant's deltas (`source`, made from `base`) against the store's base: its fingerprint, and every
        changed parameter's name and shape (against `base` itself while the store has none). -> the shapes used."""
        self.check_base(base, source)
        shapes = self.base_shapes()
        if shapes is None:
            shapes = base_shapes(base.get("name"), source)
        check_shapes({name: tuple(delta.shape) for name, delta in deltas.items()}, shapes, source)
        return shapes

    def _claim_base(self, base: dict[str, str], shapes: Shapes) -> bool:
        """Make store.json for `base`, only if no writer has: written whole under a temporary name, then linked
        into place (a link never replaces a file). False when another writer's store.json was there first."""
        temporary = self.root / f".{STORE_FILE}.{uuid.uuid4().hex[:8]}.tmp-{os.getpid()}"
        descriptor = os.open(temporary, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        try:
            with os.fdopen(descriptor, "w") as handle:
                json.dump({"base": base, "shapes": shapes}, handle, indent=2)
                handle.write("\n")
            os.link(temporary, self.root / STORE_FILE)
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(temporary)

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
        return sorted(p.name for p in self.root.iterdir()
                      if (p / MANIFEST).is_file() and USER_ID_PATTERN.fullmatch(p.name))

    def list(self) -> list[VariantRecord]:
        return [self.get(user) for user in self.users()]

    def _refuse_case_twin(self, user_id: str, doing: str) -> None:
        """A VariantError when another user's id equals `user_id` ignoring case, and `user_id` itself is not one:
        on a case-insensitive filesystem both name one folder, so `doing` would touch that user's variant. A store
        that holds both already (made on a case-sensitive one) keeps serving and replacing each."""
        users = self.users()
        twin = next((user for user in users if user.lower() == user_id.lower() and user != user_id), None)
        if twin is not None and user_id not in users:
            raise VariantError(f"User {user_id!r} differs from the existing user {twin!r} in {self.root} only in "
                               "case; where case is ignored (macOS, Windows) the two are one folder, and "
                               f"{doing} {user_id!r} would change {twin!r}'s variant. Use {twin!r} for that user, "
                               "or choose another id.")

    # -- writing -----------------------------------------------------------------------------------
    @contextmanager
    def _writing(self, user_id: str) -> Iterator[None]:
        """This process is `user_id`'s one writer until the block ends (OutputLock: a lock file with pid and host;
        a live writer's is refused, a dead one's taken over). What dead writers left half-built goes first."""
        created = self._make_root()
        # Lower-cased, so that `alice` and `Alice` take one lock: two new ids equal ignoring case, written at once,
        # would otherwise both pass the check for an existing one.
        lock = OutputLock(self.root / check_user_id(user_id).lower(), what="variant create", file=True)
        try:
            lock.acquire()
        except OutputError as exc:
            raise VariantError(f"A variant for user {user_id!r} is being created in {self.root} already: {exc}") \
                from None
        try:
            remove_stale_temps(self.root)
            yield
        finally:
            lock.release()
            if created and not any(self.root.iterdir()):
                self.root.rmdir()  # a first write that failed leaves no empty store behind

    def _make_root(self) -> bool:
        """Make the store's folder (True if this made it); a file in the way is an OutputError naming it."""
        if self.root.is_dir():
            return False
        blocker = next((p for p in (self.root, *self.root.parents) if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            raise OutputError(f"Cannot make the variant store {self.root}: {blocker} is a file, not a folder. "
                              "Choose another path.")
        self.root.mkdir(parents=True, exist_ok=True)
        return True

    @contextmanager
    def creating(self, user_id: str, *, replace: bool = False) -> Iterator[Path]:
        """A temporary folder to build `user_id`'s variant in (delta.safetensors or adapter/, and manifest.json);
        on a clean exit it is checked and becomes the user's variant. A write of the same user already running is
        refused, and so is an existing variant unless `replace`."""
        check_user_id(user_id)
        with self._writing(user_id):
            self._refuse_case_twin(user_id, "creating")  # before exists(), which a case-insensitive disk answers
            if self.exists(user_id) and not replace:
                raise VariantError(f"User {user_id!r} already has a variant in {self.root}; delete it first "
                                   "(or replace it: --replace, or replace_existing=True in create_variant, "
                                   "replace=True in add).")
            temporary = temp_path(self.path(user_id))
            temporary.mkdir()
            try:
                yield temporary
                self._commit(user_id, temporary)
            finally:
                shutil.rmtree(temporary, ignore_errors=True)

    def _read(self, folder: Path) -> tuple[dict[str, ParamDelta], dict[str, str]]:
        """(deltas as the engine serves them, the base they were made from) of the variant in `folder`, read whole."""
        if (folder / ADAPTER_DIR).is_dir():  # a LoRA adapter carries no fingerprint: its manifest names the base
            manifest = json.loads((folder / MANIFEST).read_text())
            base = dict(manifest.get("base") or {}) or self.base() or describe_base(adapter_base(folder / ADAPTER_DIR))
            return deltas_from_adapter(folder / ADAPTER_DIR), base
        deltas, header = deltas_from_file(folder / DELTA_FILE)
        return deltas, dict(header.get("base", {}))

    def _commit(self, user_id: str, folder: Path) -> None:
        if not (folder / MANIFEST).is_file():
            raise VariantError(f"{folder} has no {MANIFEST}.")
        deltas, base = self._read(folder)
        source = str(folder / (ADAPTER_DIR if (folder / ADAPTER_DIR).is_dir() else DELTA_FILE))
        shapes = self.check_variant(deltas, base, source)  # against the store's base, or its own if none yet
        if not self._claim_base(base, shapes):  # the store has a base, maybe made by another writer since: it decides
            self.check_variant(deltas, base, source)
        versions = self.root / VERSIONS / user_id
        versions.mkdir(parents=True, exist_ok=True)
        version = versions / uuid.uuid4().hex[:12]
        folder.rename(version)
        self._point(user_id, version)

    def _point(self, user_id: str, version: Path) -> None:
        """Switch `user_id`'s link to `version` in one rename, then drop every other version but the one replaced."""
        link = self.path(user_id)
        versions = version.parent
        previous = os.readlink(link).rsplit("/", 1)[-1] if link.is_symlink() else None
        if link.is_dir() and not link.is_symlink():  # a variant stored before versions: moved aside, not atomic
            previous = f"unversioned-{uuid.uuid4().hex[:8]}"
            link.rename(versions / previous)
        temporary = link.with_name(f".{user_id}.link.tmp-{os.getpid()}")
        temporary.unlink(missing_ok=True)
        temporary.symlink_to(version.relative_to(self.root))
        os.replace(temporary, link)
        for old in versions.iterdir():
            if old.name not in (version.name, previous):
                shutil.rmtree(old, ignore_errors=True)

    def add(self, user_id: str, *, delta: str | os.PathLike[str] | None = None,
            adapter: str | os.PathLike[str] | None = None, replace: bool = False) -> VariantRecord:
        """Put an existing variant in the store: a Gym delta file (`gym delta compress`: BitDelta or
        DeltaQuant) or a LoRA adapter folder, read whole, checked against the store's base, and copied."""
        if (delta is None) == (adapter is None):
            raise ConfigError("Give the variant as a delta file (--delta, delta=) or a LoRA adapter folder (--adapter, "
                              "adapter=): one.")
        given = delta if delta is not None else adapter
        assert given is not None
        source = Path(given).expanduser()
        check_user_id(user_id)
        refuse_file_in_path(self.root)  # where it goes, before minutes of reading what goes there
        self._refuse_case_twin(user_id, "adding")  # checked again under the lock
        # Checked here first, so that errors name the user's own file; the copy is checked again when committed.
        if delta is not None:
            deltas, header = deltas_from_file(source)
            base, method = dict(header.get("base", {})), str(header.get("method"))
        else:
            deltas, method = deltas_from_adapter(source), "lora"  # a plain LoRA the engine can serve, or a clear error
            base = self.base() or describe_base(adapter_base(source))
        self.check_variant(deltas, base, str(source))
        with self.creating(user_id, replace=replace) as folder:
            if delta is not None:
                shutil.copyfile(source, folder / DELTA_FILE)
            else:
                (folder / ADAPTER_DIR).mkdir()
                for name in ("adapter_config.json", "adapter_model.safetensors"):
                    shutil.copyfile(source / name, folder / ADAPTER_DIR / name)
            size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
            record = VariantRecord(user=user_id, base=base, method=method, bytes=size, created=now(), seconds=0.0,
                                   training={"added_from": str(source)})
            write_manifest(folder, record)
        return record

    def delete(self, user_id: str) -> None:
        self._refuse_case_twin(user_id, "deleting")  # where case is ignored, exists() would find the other's
        if not self.exists(user_id):
            raise VariantError(f"No variant for user {user_id!r} in {self.root}.")
        with self._writing(user_id):
            target = self.path(user_id)
            if not (target / MANIFEST).is_file():
                raise VariantError(f"No variant for user {user_id!r} in {self.root}.")
            if target.is_symlink():
                target.unlink()  # one step: readers find the variant, then none
            else:  # a variant stored before versions: renamed first, so a reader never sees half of it
                doomed = temp_path(target)
                target.rename(doomed)
                shutil.rmtree(doomed, ignore_errors=True)
            shutil.rmtree(self.root / VERSIONS / user_id, ignore_errors=True)


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _write_json(path: Path, value: Any) -> None:
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    temporary.write_text(json.dumps(value, indent=2) + "\n")
    temporary.replace(path)


def write_manifest(folder: Path, record: VariantRecord) -> None:
    _write_json(folder / MANIFEST, record.to_json())


@dataclass
class VariantFiles:
    """What a variant is made of, as export and eval load it: the base model, and its delta file or adapter."""

    base: str
    delta: str | None = None
    adapter: str | None = None


def variant_source(reference: str) -> VariantFiles:
    """The files of the variant STORE:USER (a missing user is a clear error naming the known ones)."""
    folder, _, user = reference.rpartition(":")
    store = VariantStore(folder)
    store.get(user)
    base = (store.base() or {}).get("name")
    if store.adapter_path(user).is_dir():
        return VariantFiles(base or adapter_base(store.adapter_path(user)), adapter=str(store.adapter_path(user)))
    return VariantFiles(base or "smollm2-135m", delta=str(store.delta_path(user)))
