"""`gym keys create|list|revoke STORE`: the key printed once and last, listed never, and a revoked key refused by a
running server on its very next request."""

from __future__ import annotations

import openai
import pytest
from tests.service.conftest import gym_keys, new_key

from gym.service.service import open_service


def test_create_prints_the_key_last_and_list_never_shows_it(tmp_path):
    store = tmp_path / "store"
    code, out, _ = gym_keys("create", str(store), "--user", "alice")
    assert code == 0
    key = out.split()[-1]
    assert key.startswith("sk-gym-") and out.rstrip().endswith(key)
    admin = new_key(store, "--admin")
    code, listing, _ = gym_keys("list", str(store))
    assert code == 0 and key not in listing and admin not in listing
    lines = listing.strip().splitlines()
    assert lines[0].split("\t") == ["id", "who", "created", "revoked"]
    assert sorted(line.split("\t")[1] for line in lines[1:]) == ["admin", "user:alice"]
    assert all(line.split("\t")[3] == "-" for line in lines[1:])
    assert key not in (store / "service.db").read_bytes().decode("latin-1")  # only its hash is kept


@pytest.mark.parametrize("argv, message", [
    (["create", "{store}", "--user", "../bob"], "user id '../bob'"),
    (["revoke", "{store}", "key_nope"], "No key 'key_nope'"),
    (["list", "{missing}"], "no such store"),
    (["create", "{store}", "--db", "mysql://h/db", "--admin"], "not supported"),
])
def test_user_errors_are_one_line_and_exit_2(tmp_path, argv, message):
    (tmp_path / "store").mkdir()
    argv = [a.format(store=tmp_path / "store", missing=tmp_path / "missing") for a in argv]
    code, _, err = gym_keys(*argv)
    assert code == 2 and message in err and "Traceback" not in err


def test_create_takes_a_user_or_admin_not_both(tmp_path):
    assert gym_keys("create", str(tmp_path), "--user", "a", "--admin")[0] == 2
    assert gym_keys("create", str(tmp_path))[0] == 2


def test_a_revoked_key_is_refused_on_the_next_request(tmp_path, tiny_chat, serve_app):
    store = tmp_path / "store"
    key = new_key(store, "--user", "alice")
    url = serve_app(tiny_chat, service=open_service(store))
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=30)
    assert [m.id for m in client.models.list().data] == ["tiny"]
    key_id = gym_keys("list", str(store))[1].strip().splitlines()[1].split("\t")[0]
    assert gym_keys("revoke", str(store), key_id)[0] == 0
    with pytest.raises(openai.AuthenticationError) as refused:
        client.models.list()
    assert refused.value.body["code"] == "invalid_api_key"
    code, listing, _ = gym_keys("list", str(store))
    assert listing.strip().splitlines()[1].split("\t")[3] != "-"


def test_a_database_that_cannot_be_reached_fails_closed_with_a_503(tmp_path, tiny_chat, serve_app):
    """No key can be checked, so nothing is served (never an open door), and the client is told to retry."""
    from sqlalchemy import create_engine

    from gym.service.db import Database

    (tmp_path / "store").mkdir()
    service = open_service(tmp_path / "store")
    service.db = Database(create_engine(f"sqlite:///{tmp_path}/no/such/folder/service.db"), "sqlite:///gone")
    url = serve_app(tiny_chat, service=service)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="anything", max_retries=0, timeout=30)
    with pytest.raises(openai.InternalServerError) as caught:
        client.models.list()
    assert caught.value.status_code == 503 and caught.value.body["code"] == "database_unavailable"
