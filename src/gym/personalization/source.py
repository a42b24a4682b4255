"""A variant store as the serving engine's source of variants (gym.infer.fast.bank.VariantSource).

A variant's version is its folder's identity on disk (inode and modification time of its manifest): a
replace renames a new folder into place, so the version changes and the engine reloads it; a delete
removes the manifest with the folder, so the variant stops being found.
"""

from __future__ import annotations

import os

from gym.core.errors import GymError
from gym.infer.fast.deltas import ParamDelta
from gym.personalization.loading import deltas_from_adapter, deltas_from_file
from gym.personalization.store import ADAPTER_DIR, DELTA_FILE, MANIFEST, VariantError, VariantStore


class StoreSource:
    def __init__(self, store: VariantStore) -> None:
        self.store = store

    def names(self) -> list[str]:
        return self.store.users()

    def version(self, name: str) -> str | None:
        try:
            stat = os.stat(self.store.path(name) / MANIFEST)
        except (GymError, OSError):  # not a valid user id, or no such variant (any more)
            return None
        return f"{stat.st_ino}-{stat.st_mtime_ns}"

    def load(self, name: str) -> dict[str, ParamDelta]:
        folder = self.store.path(name)
        if (folder / DELTA_FILE).is_file():
            deltas, header = deltas_from_file(folder / DELTA_FILE)
            self.store.check_base(dict(header.get("base", {})), str(folder / DELTA_FILE))
            return deltas
        if (folder / ADAPTER_DIR).is_dir():
            return deltas_from_adapter(folder / ADAPTER_DIR)
        raise VariantError(f"The variant {name!r} in {self.store.root} has neither {DELTA_FILE} nor {ADAPTER_DIR}/.")
