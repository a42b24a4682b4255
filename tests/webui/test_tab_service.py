"""The web UI's Fine-tuning jobs tab, against a live `gym api --variants` app (no worker: jobs stay queued): the key
is the login, so each key sees its own jobs only; the tab's calls create, show and cancel a job; a revoked or
unknown key and an unreachable server are one line each."""

from __future__ import annotations

import json

import pytest
from tests.service.conftest import gym_keys, new_key, serve_app, tiny_chat  # noqa: F401  (fixtures)
from tests.service.test_jobs import QUESTIONS, chat_row

from gym.core.errors import GymError
from gym.service.service import open_service
from gym.webui.tab_service import ServiceView


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_chat, serve_app):  # noqa: F811
    store = tmp_path_factory.mktemp("service-tab") / "store"
    keys = {who: new_key(store, "--user", who) for who in ("alice", "bob")}
    url = serve_app(tiny_chat, service=open_service(store))
    return url, keys, store


def test_a_key_creates_shows_and_cancels_its_own_job(served, tmp_path):
    url, keys, _ = served
    rows = tmp_path / "train.jsonl"
    rows.write_text("".join(json.dumps(chat_row(q)) + "\n" for q in QUESTIONS))
    alice = ServiceView(url, keys["alice"])
    assert alice.models() == ["tiny"]
    job_id = alice.create(str(rows), "tiny", "zorb", 2)
    assert [row[0] for row in alice.jobs()] == [job_id]
    assert alice.detail(job_id).startswith(f"{job_id}: queued")
    assert ServiceView(url, keys["bob"]).jobs() == []  # bob's key sees none of alice's
    with pytest.raises(GymError, match="Reading the job: .*"):
        ServiceView(url, keys["bob"]).detail(job_id)
    assert alice.cancel(job_id) == "cancelled"
    assert "cancelled" in alice.detail(job_id)


def test_a_revoked_key_an_unknown_key_and_no_server_are_one_line(served):
    url, _, store = served
    key = new_key(store, "--user", "carol")
    key_id = next(line.split()[0] for line in gym_keys("list", str(store))[1].splitlines() if "carol" in line)
    assert gym_keys("revoke", str(store), key_id)[0] == 0
    with pytest.raises(GymError, match="refused the key"):
        ServiceView(url, key).jobs()
    with pytest.raises(GymError, match="refused the key"):
        ServiceView(url, "sk-gym-not-a-key").models()
    with pytest.raises(GymError, match="no server answers"):
        ServiceView("http://127.0.0.1:9", "sk-gym-x").models()
    with pytest.raises(GymError, match="API key"):
        ServiceView(url, " ")
