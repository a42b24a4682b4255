"""The service of one variant store: its database, its files and its fine-tuning jobs, opened once by
`gym api --variants STORE`."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from gym.core.errors import ConfigError
from gym.service.db import Database, open_database
from gym.service.files import FileLimits, FileStore
from gym.service.queue import JobLimits, JobQueue

STALE_UPLOAD_SECONDS = 3600  # an upload's temporary file untouched this long was left by a server that died


@dataclass
class Service:
    store: Path
    db: Database
    files: FileStore
    jobs: JobQueue


def open_service(store_dir: str | Path, db_url: str | None = None, limits: FileLimits | None = None,
                 job_limits: JobLimits | None = None) -> Service:
    store = Path(store_dir).expanduser()
    if not store.is_dir():
        raise ConfigError(f"{store_dir}: no such store folder.")
    db = open_database(store, db_url)
    files = FileStore(store, db, limits)
    if files.root.is_dir():  # uploads cut off by a crash: a live upload writes to its file every moment
        for temp in files.root.glob(".upload-*.tmp"):
            try:
                if time.time() - temp.stat().st_mtime > STALE_UPLOAD_SECONDS:
                    temp.unlink()
            except OSError:
                pass
    return Service(store=store, db=db, files=files, jobs=JobQueue(store, db, files, job_limits))
