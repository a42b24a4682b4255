"""The service's database: API keys, uploaded files, fine-tuning jobs and their events (SQLAlchemy 2 ORM).

One store has one database. By default it is SQLite at `<store>/service.db`, opened in WAL mode with a busy
timeout and foreign keys on, so the API server, `gym keys` and job workers (separate processes) can use it at
once: readers never block the writer, and a writer waits for another instead of failing at once. A
`postgresql://` (or `postgresql+psycopg://`) URL puts it in PostgreSQL instead, for several server replicas.

This module owns sessions: everything else calls `Database.session()` (a read, or a write that may be refused
by a concurrent one) or `Database.session(write=True)` (a write that must see the latest rows: on SQLite it
takes the write lock when it begins, so a read-then-write such as a quota check or a worker claiming a job is
never overtaken between its read and its write). Tables are created on first open; times are Unix seconds, as
OpenAI's objects carry them.
"""

from __future__ import annotations

import enum
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    Engine,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    create_engine,
    event,
    inspect,
    text,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, OperationalError, ProgrammingError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from gym.core.errors import ConfigError, GymError

DB_FILE = "service.db"
BUSY_TIMEOUT_MS = 30_000  # a writer waits this long for another (a worker's heartbeat, a key being revoked)


def now() -> int:
    return int(time.time())


class DatabaseUnavailable(GymError):
    """The database cannot be reached, or stayed locked past the busy timeout: retry later (HTTP 503)."""


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON}


class ApiKey(Base):
    """A key: bound to one user id, or an admin's (user_id None). Only its SHA-256 is kept; the key itself is
    shown once, when it is created. Rows are never deleted, only revoked: a store that ever had a key keeps
    requiring one (revoking every key must not open the server)."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # "key_…": what `gym keys revoke` takes
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    user_id: Mapped[str | None] = mapped_column(String(128), index=True)
    admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[int] = mapped_column(Integer, default=now)
    revoked_at: Mapped[int | None] = mapped_column(Integer)


class StoredFile(Base):
    """An uploaded file (OpenAI's Files API): its bytes live at `<store>/.service/files/<id>`."""

    __tablename__ = "files"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # "file-…"
    user_id: Mapped[str | None] = mapped_column(String(128), index=True)  # None: uploaded with an admin key
    filename: Mapped[str] = mapped_column(String(255))
    purpose: Mapped[str] = mapped_column(String(32))
    bytes: Mapped[int] = mapped_column(Integer)
    rows: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))  # "chat" or "preference": the rows' format, checked on upload
    created_at: Mapped[int] = mapped_column(Integer, default=now)


class JobStatus(str, enum.Enum):
    """OpenAI's fine-tuning job states."""

    VALIDATING_FILES = "validating_files"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


ACTIVE_STATES = (JobStatus.VALIDATING_FILES.value, JobStatus.QUEUED.value, JobStatus.RUNNING.value)


class Job(Base):
    """A fine-tuning job (OpenAI's shape). The job worker (gym.service's runner) claims queued jobs, keeps
    `heartbeat` fresh while it runs one, and resumes from `checkpoint` after a crash (`attempts` counts tries)."""

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # "ftjob-…"
    user_id: Mapped[str | None] = mapped_column(String(128), index=True)
    model: Mapped[str] = mapped_column(String(255))
    training_file: Mapped[str] = mapped_column(String(40))
    validation_file: Mapped[str | None] = mapped_column(String(40))
    method: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    suffix: Mapped[str | None] = mapped_column(String(64))
    seed: Mapped[int | None] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(24), default=JobStatus.QUEUED.value)
    fine_tuned_model: Mapped[str | None] = mapped_column(String(255))
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[int] = mapped_column(Integer, default=now)
    started_at: Mapped[int | None] = mapped_column(Integer)
    finished_at: Mapped[int | None] = mapped_column(Integer)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    checkpoint: Mapped[str | None] = mapped_column(Text)
    worker_id: Mapped[str | None] = mapped_column(String(128))
    heartbeat: Mapped[int | None] = mapped_column(Integer)
    # the owner asked to cancel a running job: its worker reads this between steps and stops there
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # resolved hyperparameters, steps and tokens
    # the creator's own labels (OpenAI's `metadata`); `metadata` itself is SQLAlchemy's on a declarative class
    labels: Mapped[dict[str, str] | None] = mapped_column("metadata", JSON)

    __table_args__ = (Index("ix_jobs_status_created", "status", "created_at"),)


class JobEvent(Base):
    """One line of a job's log (OpenAI's fine_tuning.job.event)."""

    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(40), ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[int] = mapped_column(Integer, default=now)
    level: Mapped[str] = mapped_column(String(8), default="info")
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class Database:
    """An open database; `session()` is the one way in."""

    def __init__(self, engine: Engine, url: str) -> None:
        self.engine = engine
        self.url = url  # without a password: safe to print
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    @property
    def sqlite(self) -> bool:
        return self.engine.dialect.name == "sqlite"

    @contextmanager
    def session(self, *, write: bool = False) -> Iterator[Session]:
        """A transaction: committed when the block ends, rolled back if it raises. `write=True`: the transaction
        holds the write lock from its start (SQLite), so what it read cannot change before it writes."""
        with self._sessions() as session:
            if write and self.sqlite:
                session.connection(execution_options={"gym_begin": "BEGIN IMMEDIATE"})
            try:
                yield session
                session.commit()
            except OperationalError as exc:  # the server is down, or SQLite stayed locked past the busy timeout
                session.rollback()
                raise DatabaseUnavailable(f"The service database ({self.url}) is unavailable: "
                                          f"{str(exc.orig).strip() or type(exc.orig).__name__}.") from None
            except BaseException:
                session.rollback()
                raise

    def lock(self, session: Session, name: str) -> None:
        """Serialise write transactions about `name` (e.g. one user's quota) across processes: PostgreSQL takes an
        advisory lock until the transaction ends; SQLite's `write=True` session already holds the only write lock."""
        if not self.sqlite:
            session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": zlib.crc32(name.encode())})

    def close(self) -> None:
        self.engine.dispose()


_opened: dict[str, Database] = {}
_opening = threading.Lock()


def database_url(store_dir: str | Path, url: str | None = None) -> str:
    """The SQLAlchemy URL: `url` as given (postgresql:// means psycopg 3, the driver Gym installs), else SQLite in
    the store."""
    if url is None:
        return f"sqlite:///{Path(store_dir).expanduser().resolve() / DB_FILE}"
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigError(f"--db {url!r}: not a database URL (postgresql://user@host/db or sqlite:///path).") from None
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.drivername not in ("postgresql+psycopg", "sqlite"):
        raise ConfigError(f"--db: {parsed.drivername} is not supported; use postgresql:// or sqlite:///PATH.")
    return parsed.render_as_string(hide_password=False)


def open_database(store_dir: str | Path, url: str | None = None) -> Database:
    """The store's database (SQLite `<store>/service.db`, or `url`), its tables created if missing. One Database
    per URL per process: the server's requests share its connection pool."""
    full = database_url(store_dir, url)
    with _opening:
        found = _opened.get(full)
        if found is not None:
            return found
        if full.startswith("sqlite:"):
            path = Path(make_url(full).database or "")
            if not path.parent.is_dir():
                raise ConfigError(f"{path.parent}: no such folder for the service database.")
            engine = create_engine(full, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000, "check_same_thread": False})
            _sqlite_pragmas(engine)
        else:
            try:
                engine = create_engine(full, pool_pre_ping=True)
            except ImportError:
                raise ConfigError("A PostgreSQL --db needs psycopg: pip install 'zoo-gym[postgres]'.") from None
        try:
            Base.metadata.create_all(engine)
            add_missing_columns(engine)
        except OperationalError as exc:
            engine.dispose()
            raise ConfigError(f"Cannot open the service database {make_url(full).render_as_string()}: "
                              f"{exc.orig}".strip()) from None
        database = Database(engine, make_url(full).render_as_string())
        _opened[full] = database
        return database


def add_missing_columns(engine: Engine) -> list[str]:
    """Bring a database made by an earlier Gym up to these tables: create_all makes missing tables but never
    alters an existing one, so each column added since (always nullable, so old rows stay valid) is added here.
    Returns "table.column" for each one added. Every process runs this on open; two at once are harmless (the
    loser's ALTER fails on the existing column and is ignored)."""
    added = []
    found = inspect(engine)
    for table in Base.metadata.sorted_tables:
        if not found.has_table(table.name):
            continue
        have = {column["name"] for column in found.get_columns(table.name)}
        for column in table.columns:
            if column.name in have:
                continue
            if not column.nullable:
                raise ConfigError(f"The service database lacks {table.name}.{column.name}, which cannot be added "
                                  "to existing rows; migrate it by hand or start a new database.")
            kind = column.type.compile(dialect=engine.dialect)
            try:
                with engine.begin() as conn:
                    conn.exec_driver_sql(f'ALTER TABLE {table.name} ADD COLUMN "{column.name}" {kind}')
            except (OperationalError, ProgrammingError):
                if column.name not in {c["name"] for c in inspect(engine).get_columns(table.name)}:
                    raise
            added.append(f"{table.name}.{column.name}")
    return added


def _sqlite_pragmas(engine: Engine) -> None:
    """WAL (readers and one writer at once, across processes), a busy timeout (wait for the writer, do not fail),
    foreign keys (SQLite leaves them off). pysqlite's own BEGIN handling is replaced by ours, so that a write
    session can begin IMMEDIATE (SQLAlchemy's documented recipe)."""

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, record: Any) -> None:
        dbapi_connection.isolation_level = None  # we emit BEGIN ourselves
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")  # durable across a process crash; WAL keeps it consistent
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: Any) -> None:
        connection.exec_driver_sql(connection.get_execution_options().get("gym_begin", "BEGIN"))
