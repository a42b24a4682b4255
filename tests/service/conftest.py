"""Fixtures for the service (keys, tenants, files): a variant store with two users' variants (tiny BitDeltas),
a ChatModel serving it, live `gym api` apps on 127.0.0.1 (uvicorn threads: the real openai client, and bodies
streamed as they would be over the network), `gym keys` run as a user would, and a PostgreSQL server of its
own when the binaries and psycopg are there."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest
from tests.conftest import bitdelta, free_port
from tests.gym_cli import gym_here


def gym_keys(*argv: str) -> tuple[int, str, str]:
    """`gym keys ...` in this process: (exit status, stdout, stderr)."""
    done = gym_here("keys", *argv)
    return done.returncode, done.stdout, done.stderr


def new_key(store: Path, *who: str, db: str | None = None) -> str:
    """`gym keys create STORE ...` (with `--db URL` when the database is not the store's SQLite): the new key."""
    code, out, err = gym_keys("create", str(store), *who, *(["--db", db] if db else []))
    assert code == 0, err
    return out.split()[-1]


@pytest.fixture(scope="module")
def variant_store(tiny_model_dir, tmp_path_factory):
    """A store holding alice's and bob's variants (and no keys yet)."""
    from gym.personalization.store import VariantStore

    folder = tmp_path_factory.mktemp("service")
    store = VariantStore(folder / "store")
    store.add("alice", delta=bitdelta(tiny_model_dir, folder, 1))
    store.add("bob", delta=bitdelta(tiny_model_dir, folder, 2))
    return store


@pytest.fixture(scope="module")
def variant_chat(tiny_model_dir, variant_store):
    from gym.infer.chat import ChatModel
    from gym.personalization.source import StoreSource

    chat = ChatModel({"model_name_or_path": str(tiny_model_dir), "infer_dtype": "float32", "max_new_tokens": 6},
                     max_batch_size=8, variants=StoreSource(variant_store))
    yield chat
    chat.close()


# -- PostgreSQL ----------------------------------------------------------------------------------------------------
def _pg_bin() -> Path | None:
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (candidate / "initdb").is_file() and (candidate / "pg_ctl").is_file():
            return candidate
    found = shutil.which("initdb")
    return Path(found).parent if found and shutil.which("pg_ctl") else None


@pytest.fixture(scope="session")
def postgres_url():
    """A PostgreSQL server of this test session's own, in a temporary folder on a free port; its URL. Skipped
    where the server's binaries or psycopg are missing. The server refuses to run as root: then as `postgres`."""
    # ImportError too, not only a missing module: psycopg without its libpq ("no pq wrapper available") is no driver
    pytest.importorskip("psycopg", reason="psycopg is not usable (pip install 'zoo-gym[postgres]')",
                        exc_type=ImportError)
    bin_dir = _pg_bin()
    if bin_dir is None:
        pytest.skip("PostgreSQL's server binaries (initdb, pg_ctl) are not installed")
    as_user: list[str] = []
    if os.geteuid() == 0:
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no `postgres` user to run the server as")
        as_user = ["runuser", "-u", "postgres", "--"]
    root = Path(tempfile.mkdtemp(prefix="gym-pg-"))
    data = root / "data"
    if as_user:
        os.chown(root, owner.pw_uid, owner.pw_gid)
    port = free_port()
    run = {"check": True, "capture_output": True, "text": True, "timeout": 120}
    try:
        subprocess.run([*as_user, str(bin_dir / "initdb"), "-D", str(data), "-U", "gym", "--auth=trust",
                        "-E", "UTF8"], **run)
        subprocess.run([*as_user, str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(root / "log"), "-w", "-o",
                        f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off", "start"], **run)
    except subprocess.CalledProcessError as exc:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"could not start a PostgreSQL server: {exc.stderr or exc.stdout}")
    try:
        yield f"postgresql://gym@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_user, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)


def new_database(server: str) -> str:
    """A fresh, empty database on `server` (a PostgreSQL URL): its URL."""
    import psycopg

    name = f"gym_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return server.rsplit("/", 1)[0] + f"/{name}"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """(store folder, URL or None): SQLite in the store, or a fresh database on the session's PostgreSQL server."""
    if request.param == "sqlite":
        return tmp_path, None
    return tmp_path, new_database(request.getfixturevalue("postgres_url"))


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def module_db(request) -> str | None:
    """One database for a whole module, run once per kind: None (SQLite in the store) or a PostgreSQL URL."""
    return None if request.param == "sqlite" else new_database(request.getfixturevalue("postgres_url"))


@pytest.fixture(scope="module")
def tiny_chat(tiny_model_dir):
    from gym.infer.chat import ChatModel

    chat = ChatModel({"model_name_or_path": str(tiny_model_dir), "max_new_tokens": 6}, max_batch_size=8)
    yield chat
    chat.close()
