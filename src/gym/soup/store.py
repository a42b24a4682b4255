"""A soup on disk: an SQLite ledger plus content-addressed tensor blobs, safe for several processes.

    <soup>/soup.sqlite                    meta, contributions, rounds, rewards, reputation
    <soup>/blobs/<sha256>.safetensors     one per stored delta (contributions and round aggregates)

Blobs are written under a temporary name and renamed to the sha256 of their bytes, so a reader never
sees half a file and identical deltas are stored once. The ledger runs in WAL mode (readers never block
the writer) with a busy timeout, and every read-modify-write is one `BEGIN IMMEDIATE` transaction, which
takes the write lock up front: two processes contributing at once queue instead of interleaving, and
"which round is open" and "is the round full" are decided under that lock.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from gym.core.errors import ConfigError
from gym.core.files import make_folder, readable_as_umask, remove_stale_temps, temp_path
from gym.delta.compress import reconstruct
from gym.delta.format import HEADER_KEY
from gym.delta.tensor_quant import Encoded, QuantMethod
from gym.soup.sources import SafetensorsSource

SCHEMA_VERSION = 1
LEDGER = "soup.sqlite"
BLOBS = "blobs"
BLOB_KEY = "gym_soup"  # safetensors metadata key of a dense blob
BUSY_TIMEOUT_S = 60.0

ACCEPTED, REJECTED, EXCLUDED, SUPERSEDED = "accepted", "rejected", "excluded", "superseded"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS contributions (
    id INTEGER PRIMARY KEY AUTOINCREMENT, user_id TEXT NOT NULL, round INTEGER NOT NULL, blob TEXT,
    status TEXT NOT NULL, reason TEXT, norm REAL, num_samples INTEGER, created_at REAL NOT NULL,
    info TEXT NOT NULL DEFAULT '{}');
CREATE INDEX IF NOT EXISTS contributions_round ON contributions (round, status);
CREATE TABLE IF NOT EXISTS rounds (
    id INTEGER PRIMARY KEY, method TEXT NOT NULL, n INTEGER NOT NULL, contributions TEXT NOT NULL,
    selected TEXT NOT NULL, weights TEXT NOT NULL, privacy TEXT, aggregate_blob TEXT NOT NULL,
    info TEXT NOT NULL DEFAULT '{}', created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS rewards (
    round INTEGER NOT NULL, user_id TEXT NOT NULL, contribution_id INTEGER NOT NULL, quality REAL NOT NULL,
    participation REAL NOT NULL, amount REAL NOT NULL, PRIMARY KEY (round, user_id));
CREATE TABLE IF NOT EXISTS reputation (user_id TEXT PRIMARY KEY, value REAL NOT NULL, rounds INTEGER NOT NULL);
"""


@dataclass
class ContributionRecord:
    """One row of the ledger: what `DeltaSoup.contribute` returns. status: accepted, rejected (reason says
    why), excluded (accepted, but the aggregator did not select it) or superseded (the same user contributed
    again in the same round; the latest counts)."""

    id: int
    user_id: str
    round: int
    status: str
    reason: str | None = None
    norm: float | None = None
    num_samples: int | None = None
    blob: str | None = None
    created_at: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def accepted(self) -> bool:
        return self.status == ACCEPTED


@dataclass
class RoundRecord:
    id: int
    method: str
    n: int
    contributions: list[int]
    selected: list[int]  # contribution ids the aggregator kept
    weights: list[float]
    privacy: dict[str, Any] | None
    aggregate_blob: str
    info: dict[str, Any]
    created_at: float


class Store:
    """The ledger and blobs of one soup folder. `Store.create` makes a new one; `Store(path)` opens one."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not (self.path / LEDGER).is_file():
            raise ConfigError(f"{self.path} is not a soup (no {LEDGER}); make one with `gym soup init {self.path} "
                              "--base MODEL` or DeltaSoup(config, path=..., base_model=...).")
        self._db = _connect(self.path / LEDGER)
        try:
            version = self.meta("schema_version")
        except sqlite3.DatabaseError as exc:  # an SQLite file, but another program's: no meta table
            self._db.close()
            raise _unreadable(self.path / LEDGER, exc) from None
        if version is None or int(version) > SCHEMA_VERSION:
            raise ConfigError(f"{self.path}: soup schema version {version} is not supported by this Gym "
                              f"(it reads up to {SCHEMA_VERSION}); upgrade Gym.")

    @classmethod
    def create(cls, path: str | os.PathLike[str], meta: dict[str, str]) -> Store:
        """A new soup folder with `meta` recorded; an existing soup is opened as it is (meta untouched)."""
        path = Path(path)
        make_folder(path / BLOBS)  # a soup path under a file: one line naming it, not NotADirectoryError
        db = _connect(path / LEDGER)
        try:
            with _immediate(db):
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
                if db.execute("SELECT 1 FROM meta WHERE key = 'schema_version'").fetchone() is None:
                    rows = {"schema_version": str(SCHEMA_VERSION), "created_at": str(time.time()), **meta}
                    db.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", rows.items())
        finally:
            db.close()
        return cls(path)

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        with _immediate(self._db):
            yield self._db

    # meta
    def meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        with self.transaction() as db:
            db.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = "
                       "excluded.value", (key, value))

    # blobs
    def blob_path(self, name: str) -> Path:
        return self.path / BLOBS / name

    def write_blob(self, write: Any) -> str:
        """write(tmp_path) writes a safetensors file; it is renamed to <sha256>.safetensors. Returns the name.
        The temporary name carries this process's pid, so what a killed contributor left is removed later."""
        remove_stale_temps(self.path / BLOBS)
        tmp = temp_path(self.path / BLOBS / f"{uuid.uuid4().hex}.safetensors")
        try:
            write(tmp)
            digest = hashlib.sha256()
            with open(tmp, "rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
            name = f"{digest.hexdigest()}.safetensors"
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())
            readable_as_umask(tmp)
            os.replace(tmp, self.blob_path(name))  # same bytes under the same name: replacing is harmless
        finally:
            tmp.unlink(missing_ok=True)
        return name

    def write_tensors(self, tensors: dict[str, torch.Tensor], metadata: dict[str, Any]) -> str:
        clean = {name: t.detach().to(torch.float32).cpu().contiguous() for name, t in tensors.items()}
        return self.write_blob(lambda tmp: save_file(clean, str(tmp), metadata={BLOB_KEY: json.dumps(metadata)}))

    def read_tensors(self, name: str) -> dict[str, torch.Tensor]:
        return load_file(str(self.blob_path(name)))

    # contributions
    def add_contribution(self, user_id: str, status: str, reason: str | None, norm: float | None,
                         num_samples: int | None, blob: str | None, info: dict[str, Any],
                         max_per_round: int) -> ContributionRecord:
        """Record a contribution in the open round. Under the write lock: an accepted one that finds the round
        full becomes rejected, and it supersedes the same user's earlier accepted one in this round."""
        now = time.time()
        with self.transaction() as db:
            round_id = _open_round(db)
            if status == ACCEPTED:
                others = db.execute("SELECT COUNT(*) FROM contributions WHERE round = ? AND status = ? AND "
                                    "user_id != ?", (round_id, ACCEPTED, user_id)).fetchone()[0]
                if others >= max_per_round:
                    status, blob = REJECTED, None
                    reason = (f"round {round_id} is full: it already holds max_contributors={max_per_round} accepted "
                              "contributions; contribute again after the next aggregation")
                else:
                    db.execute("UPDATE contributions SET status = ?, reason = ? WHERE round = ? AND user_id = ? AND "
                               "status = ?", (SUPERSEDED, "a later contribution by the same user in this round",
                                              round_id, user_id, ACCEPTED))
            cursor = db.execute(
                "INSERT INTO contributions (user_id, round, blob, status, reason, norm, num_samples, created_at, info) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (user_id, round_id, blob, status, reason, norm, num_samples, now, json.dumps(info)))
            assert cursor.lastrowid is not None  # set by the INSERT
            row_id = int(cursor.lastrowid)
        return ContributionRecord(row_id, user_id, round_id, status, reason, norm, num_samples, blob, now, info)

    def contributions(self, round_id: int | None = None, status: str | None = None) -> list[ContributionRecord]:
        args: list[int | str]
        query, args = "SELECT * FROM contributions WHERE 1 = 1", []
        if round_id is not None:
            query, args = query + " AND round = ?", [*args, round_id]
        if status is not None:
            query, args = query + " AND status = ?", [*args, status]
        return [_contribution(row) for row in self._db.execute(query + " ORDER BY id", args)]

    def open_round(self) -> int:
        return _open_round(self._db)

    # rounds
    def close_round(self, record: RoundRecord, last_seen: int, excluded: dict[int, str],
                    rewards: list[tuple[str, int, float, float, float]], reputation: dict[str, float]) -> None:
        """Record a finished round in one transaction: the round, excluded contributions (id -> the reason),
        rewards, reputation. Contributions recorded in this round after the aggregation read it (ids above
        last_seen) move to the next round."""
        with self.transaction() as db:
            if _open_round(db) != record.id:
                raise ConfigError(f"Round {record.id} was closed by another process while this one aggregated it; "
                                  "nothing was recorded. Run aggregate again for the next round.")
            db.execute("INSERT INTO rounds (id, method, n, contributions, selected, weights, privacy, aggregate_blob, "
                       "info, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (record.id, record.method, record.n, json.dumps(record.contributions),
                        json.dumps(record.selected), json.dumps(record.weights),
                        None if record.privacy is None else json.dumps(record.privacy), record.aggregate_blob,
                        json.dumps(record.info), record.created_at))
            db.executemany("UPDATE contributions SET status = ?, reason = ? WHERE id = ?",
                           [(EXCLUDED, reason, i) for i, reason in excluded.items()])
            db.execute("UPDATE contributions SET round = ? WHERE round = ? AND id > ?",
                       (record.id + 1, record.id, last_seen))
            db.executemany("INSERT INTO rewards (round, user_id, contribution_id, quality, participation, amount) "
                           "VALUES (?, ?, ?, ?, ?, ?)", [(record.id, *r) for r in rewards])
            for user_id, value in reputation.items():
                db.execute("INSERT INTO reputation (user_id, value, rounds) VALUES (?, ?, 1) ON CONFLICT (user_id) "
                           "DO UPDATE SET value = excluded.value, rounds = rounds + 1", (user_id, value))

    def rounds(self) -> list[RoundRecord]:
        return [RoundRecord(row["id"], row["method"], row["n"], json.loads(row["contributions"]),
                            json.loads(row["selected"]), json.loads(row["weights"]),
                            None if row["privacy"] is None else json.loads(row["privacy"]), row["aggregate_blob"],
                            json.loads(row["info"]), row["created_at"])
                for row in self._db.execute("SELECT * FROM rounds ORDER BY id")]

    # rewards and reputation
    def rewards(self, round_id: int | None = None) -> list[dict[str, Any]]:
        args: tuple[int, ...]
        query, args = "SELECT * FROM rewards", ()
        if round_id is not None:
            query, args = query + " WHERE round = ?", (round_id,)
        return [dict(row) for row in self._db.execute(query + " ORDER BY round, user_id", args)]

    def reputation(self) -> dict[str, float]:
        return {row[0]: row[1] for row in self._db.execute("SELECT user_id, value FROM reputation")}

    def integrity_ok(self) -> bool:
        verdict: str = self._db.execute("PRAGMA integrity_check").fetchone()[0]
        return verdict == "ok"


def _connect(path: Path) -> sqlite3.Connection:
    # isolation_level=None: we issue BEGIN IMMEDIATE ourselves instead of Python's deferred BEGIN, which would
    # take the write lock only at the first write and can then fail with "database is locked" mid-transaction.
    try:
        db = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
    except sqlite3.DatabaseError as exc:  # a folder of that name, a parent without permission
        raise _unreadable(path, exc) from None
    db.row_factory = sqlite3.Row
    try:
        db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        db.execute("PRAGMA journal_mode = WAL")  # the first read of the file: where a damaged one fails
    except sqlite3.DatabaseError as exc:
        db.close()
        raise _unreadable(path, exc) from None
    return db


def _unreadable(path: Path, exc: sqlite3.DatabaseError) -> ConfigError:
    return ConfigError(f"{path} cannot be read as a soup ledger ({exc}). Restore it from a "
                       "backup, or start a soup in another folder.")


@contextmanager
def _immediate(db: sqlite3.Connection) -> Iterator[None]:
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _open_round(db: sqlite3.Connection) -> int:
    return int(db.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM rounds").fetchone()[0])


def _contribution(row: sqlite3.Row) -> ContributionRecord:
    return ContributionRecord(row["id"], row["user_id"], row["round"], row["status"], row["reason"], row["norm"],
                              row["num_samples"], row["blob"], row["created_at"], json.loads(row["info"]))


class BlobSource:
    """The DeltaSource protocol (gym.soup.aggregators) over blobs of either kind: dense blobs, and Gym delta
    files (use_bitdelta contributions) decoded one parameter at a time, so memory holds one parameter's
    n deltas at most."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = [Path(p) for p in paths]
        self._headers: list[dict[str, Any] | None] = []
        self._shapes: dict[str, tuple[int, ...]] = {}
        for path in self.paths:
            with safe_open(str(path), framework="pt") as handle:
                metadata = handle.metadata() or {}
                if HEADER_KEY in metadata:
                    header = json.loads(metadata[HEADER_KEY])
                    self._headers.append(header)
                    shapes = {name: tuple(spec["shape"]) for name, spec in header["entries"].items()}
                else:
                    self._headers.append(None)
                    shapes = {name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()}  # noqa: SIM118 (a safe_open handle, not a dict)
            for name, shape in shapes.items():
                self._shapes.setdefault(name, shape)
        self.names = sorted(self._shapes)

    def __len__(self) -> int:
        return len(self.paths)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._shapes[name]

    def stacked(self, name: str) -> torch.Tensor:
        rows = []
        for path, header in zip(self.paths, self._headers):
            with safe_open(str(path), framework="pt") as handle:
                if header is None:
                    value = handle.get_tensor(name) if name in handle.keys() else None  # noqa: SIM118
                elif name not in header["entries"]:
                    value = None
                else:
                    spec = header["entries"][name]
                    prefix = f"{name}::"
                    parts = {key[len(prefix):]: handle.get_tensor(key) for key in handle.keys()  # noqa: SIM118
                             if key.startswith(prefix)}
                    value = parts["delta"] if spec["encoding"] == "dense" else reconstruct(Encoded(
                        QuantMethod(spec["encoding"]), tuple(spec["shape"]), parts, spec.get("params", {})))
            rows.append(torch.zeros(self._shapes[name]) if value is None else value.to(torch.float32))
        return torch.stack(rows)


def source_for(paths: list[Path]) -> Any:
    """helper-2's SafetensorsSource when every blob is dense, else a BlobSource that decodes compressed ones."""
    def dense(path: Path) -> bool:
        with safe_open(str(path), framework="pt") as handle:
            return BLOB_KEY in (handle.metadata() or {})

    return SafetensorsSource(paths) if all(dense(p) for p in paths) else BlobSource(paths)
