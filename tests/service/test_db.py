"""The service's database, the same tests on SQLite (the default, in the store) and PostgreSQL (`--db URL`;
skipped where no server can be started): tables made on first open, keys, files, jobs and their events, and
writers in several processes at once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import func, inspect, select

from gym.core.errors import ConfigError
from gym.service.db import ApiKey, Job, JobEvent, JobStatus, StoredFile, database_url, open_database
from gym.service.keys import any_keys, authenticate, create_key, list_keys, revoke_key


def test_tables_are_made_on_first_open_and_reopening_finds_them(db_url):
    store, url = db_url
    db = open_database(store, url)
    assert {"api_keys", "files", "jobs", "job_events"} <= set(inspect(db.engine).get_table_names())
    if url is None:
        assert (store / "service.db").is_file()
        with db.engine.connect() as conn:  # what makes it safe for the server, the CLI and workers at once
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 1000
    assert open_database(store, url) is db  # one pool per database per process


def test_keys_are_kept_as_hashes_and_revocation_is_seen_at_once(db_url):
    store, url = db_url
    db = open_database(store, url)
    assert not any_keys(db)
    info, key = create_key(db, user_id="alice")
    admin_info, admin_key = create_key(db, admin=True)
    assert key.startswith("sk-gym-") and len(key) > 40
    with db.session() as session:
        hashes = list(session.scalars(select(ApiKey.key_hash)))
    assert key not in str(hashes) and admin_key not in str(hashes)
    assert authenticate(db, key).user_id == "alice" and not authenticate(db, key).admin
    assert authenticate(db, admin_key).admin
    assert authenticate(db, key + "x") is None
    revoke_key(db, info.id)
    assert authenticate(db, key) is None
    assert any_keys(db)  # a revoked key still counts: the store stays keyed
    assert {k.id for k in list_keys(db)} == {info.id, admin_info.id}


def test_jobs_and_events_round_trip_with_json_and_cascade(db_url):
    store, url = db_url
    db = open_database(store, url)
    with db.session(write=True) as session:
        session.add(StoredFile(id="file-1", user_id="alice", filename="t.jsonl", purpose="fine-tune", bytes=10,
                               rows=1, kind="chat"))
        session.add(Job(id="ftjob-1", user_id="alice", model="tiny", training_file="file-1",
                        method={"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.1}}}, seed=3))
        session.flush()
        session.add(JobEvent(job_id="ftjob-1", message="queued", data={"step": 0}))
    with db.session() as session:
        job = session.get(Job, "ftjob-1")
        assert job.status == JobStatus.QUEUED.value and job.method["dpo"]["hyperparameters"]["beta"] == 0.1
        assert job.attempts == 0 and job.created_at > 0
        event = session.scalars(select(JobEvent)).one()
        assert event.data == {"step": 0} and event.level == "info"
    with db.session() as session:
        session.delete(session.get(Job, "ftjob-1"))
    with db.session() as session:  # foreign keys are on: a job's events go with it
        assert session.scalar(select(func.count()).select_from(JobEvent)) == 0


def test_a_session_that_raises_is_rolled_back(db_url):
    store, url = db_url
    db = open_database(store, url)
    with pytest.raises(RuntimeError), db.session() as session:
        session.add(StoredFile(id="file-x", user_id=None, filename="x", purpose="fine-tune", bytes=1, rows=1,
                               kind="chat"))
        session.flush()
        raise RuntimeError("boom")
    with db.session() as session:
        assert session.get(StoredFile, "file-x") is None


WRITER = """
import sys
from gym.service.db import open_database
from gym.service.keys import create_key
db = open_database(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
for i in range(15):
    create_key(db, user_id=f"user{i}")
"""


def test_writers_in_several_processes_at_once_all_succeed(db_url):
    """The server, `gym keys` and workers write at once: none may fail with 'database is locked'."""
    store, url = db_url
    open_database(store, url)  # tables first, as the server makes them
    src = Path(__file__).resolve().parents[2] / "src"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(store), *([url] if url else [])],
                              env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"}, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errors
    assert len(list_keys(open_database(store, url))) == 45


def test_database_urls():
    assert database_url("/s").endswith("/s/service.db")
    assert database_url("/s", "postgresql://u:p@h/db") == "postgresql+psycopg://u:p@h/db"
    with pytest.raises(ConfigError, match="not supported"):
        database_url("/s", "mysql://h/db")
    with pytest.raises(ConfigError, match="not a database URL"):
        database_url("/s", "::nope::")


def test_a_database_of_an_earlier_gym_gains_the_columns_added_since(db_url):
    """create_all never alters a table: a column added in a later Gym (here: jobs.metadata) is added on open,
    and the rows already there keep their values."""
    from gym.service.db import add_missing_columns

    store, url = db_url
    db = open_database(store, url)
    with db.session(write=True) as session:
        session.add(StoredFile(id="file-1", user_id="alice", filename="t.jsonl", purpose="fine-tune", bytes=10,
                               rows=1, kind="chat"))
        session.add(Job(id="ftjob-old", user_id="alice", model="tiny", training_file="file-1"))
    with db.engine.begin() as conn:  # as an earlier Gym made it
        conn.exec_driver_sql('ALTER TABLE jobs DROP COLUMN "metadata"')
    assert "metadata" not in {c["name"] for c in inspect(db.engine).get_columns("jobs")}
    assert add_missing_columns(db.engine) == ["jobs.metadata"]
    assert add_missing_columns(db.engine) == []
    with db.session(write=True) as session:
        old = session.get(Job, "ftjob-old")
        assert old.model == "tiny" and old.labels is None
        old.labels = {"team": "a"}
    with db.session() as session:
        assert session.get(Job, "ftjob-old").labels == {"team": "a"}
