"""The web UI's Fine-tuning jobs tab, against a live `gym api --variants` app (no worker: jobs stay queued): the key
is the login, so each key sees its own jobs only; the tab's calls create, show and cancel a job; a revoked or
unknown key and an unreachable server are one line each."""

from __future__ import annotations

import json

import pytest
from tests.service.conftest import gym_keys, new_key, tiny_chat  # noqa: F401  (fixtures)
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


# -- gym webui --service URL: the page's login is the service's keys -------------------------------------------------
def test_the_login_takes_a_key_with_its_own_user_id_only(served):
    from gym.webui.tab_service import KeyLogin

    url, keys, store = served
    login = KeyLogin(url)
    assert login("alice", keys["alice"]) and not login("bob", keys["alice"])  # a key files under its own name only
    assert not login("alice", "sk-gym-not-a-key") and not login("admin", keys["alice"])
    admin = new_key(store, "--admin")
    assert login("admin", admin) and not login("alice", admin)
    signed_in = type("Request", (), {"username": "alice"})()
    assert login.view(signed_in).whoami() == {"object": "api_key", "id": login.view(signed_in).whoami()["id"],
                                              "user": "alice", "admin": False}
    with pytest.raises(GymError, match="Sign in again"):
        login.view(type("Request", (), {"username": "carol"})())


def test_the_service_page_signs_in_by_key_and_shows_that_key_s_jobs_only(served, tmp_path):
    """A real page (`gym webui --service URL`) driven through Gradio's own client, as a browser's calls would be:
    the wrong name for a key is refused at login, alice sees her job and talks to the base, and her key revoked,
    the page's next action is refused."""
    import socket

    from gradio_client import Client

    from gym.webui.app import serve

    url, keys, store = served
    rows = tmp_path / "train.jsonl"
    rows.write_text("".join(json.dumps(chat_row(q)) + "\n" for q in QUESTIONS))
    alice_key = new_key(store, "--user", "alice")
    job_id = ServiceView(url, alice_key).create(str(rows), "tiny", "page", 1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo, page = serve(port=port, block=False, service=url, runs_dir=str(tmp_path / "runs"))
    try:
        with pytest.raises(Exception, match="(?i)login|credentials|401|auth"):
            Client(page, auth=("bob", alice_key), verbose=False)
        alice = Client(page, auth=("alice", alice_key), verbose=False)
        who, jobs, base, _ = alice.predict("ignored", "ignored", api_name="/on_sign_in")
        assert who.startswith("Signed in as alice") and base == "tiny"
        assert job_id in [row[0] for row in jobs["data"]]
        shown = alice.predict("", "", job_id, api_name="/on_show")
        assert shown[1].startswith(f"{job_id}: queued")
        answer = alice.predict("", "", "tiny", "Hello", api_name="/on_ask")
        assert isinstance(answer, str)
        # the hidden server field is not obeyed: the page talks to its own service, whatever a caller sends
        assert alice.predict("http://127.0.0.1:9", "sk-gym-x", "", api_name="/on_show")[0]["data"]

        for line in gym_keys("list", str(store))[1].splitlines():  # every key of alice's, the login's among them
            if "alice" in line:
                assert gym_keys("revoke", str(store), line.split()[0])[0] == 0
        with pytest.raises(Exception, match="refused the key"):
            alice.predict("", "", job_id, api_name="/on_show")
    finally:
        demo.close()
