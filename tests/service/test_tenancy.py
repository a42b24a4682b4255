"""Tenants in `gym api --variants STORE`, through the real openai client: once the store has keys, alice's key sees
the base and her own variant, bob's never sees hers (a 404, as a model that does not exist, never a 403 that would
confirm it), an admin's sees all; a store with no keys is served as before, to anyone."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import openai
import pytest
from tests.service.conftest import new_key

from gym.service.service import open_service

HELLO = [{"role": "user", "content": "Say hello."}]


def _client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)


def _ask(client: openai.OpenAI, model: str) -> str:
    return client.chat.completions.create(model=model, messages=HELLO, temperature=0, max_tokens=4).choices[0] \
        .message.content


def _get(url: str, path: str, key: str | None = None) -> int:
    request = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


@pytest.fixture(scope="module")
def keyed(variant_store, variant_chat, serve_app):
    """A server on the store before any key exists (anyone may use it), then the store's keys."""
    url = serve_app(variant_chat, service=open_service(variant_store.root), api_key=None)
    open_before = ({m.id for m in _client(url, "anything").models.list().data}, _get(url, "/docs"))
    keys = {user: new_key(variant_store.root, "--user", user) for user in ("alice", "bob", "carol")}
    keys["admin"] = new_key(variant_store.root, "--admin")
    return url, keys, open_before


def test_a_store_without_keys_is_open_as_before(keyed):
    _, _, (listed, docs) = keyed
    assert listed == {"tiny", "tiny:alice", "tiny:bob"}
    assert docs == 200


def test_alice_sees_the_base_and_her_own_variant_only(keyed):
    url, keys, _ = keyed
    alice = _client(url, keys["alice"])
    assert [m.id for m in alice.models.list().data] == ["tiny", "tiny:alice"]
    assert alice.models.retrieve("tiny:alice").id == "tiny:alice"
    assert _ask(alice, "tiny:alice") != _ask(alice, "tiny")  # her variant really answers, unlike the base


@pytest.mark.parametrize("route", ["chat", "completions", "retrieve"])
def test_another_users_variant_is_a_404_as_if_it_did_not_exist(keyed, route):
    url, keys, _ = keyed
    bob = _client(url, keys["bob"])
    calls = {"chat": lambda m: _ask(bob, m),
             "completions": lambda m: bob.completions.create(model=m, prompt="Hi", max_tokens=2),
             "retrieve": lambda m: bob.models.retrieve(m)}
    with pytest.raises(openai.NotFoundError) as theirs:
        calls[route]("tiny:alice")
    with pytest.raises(openai.NotFoundError) as nobodys:
        calls[route]("tiny:nobody")
    assert theirs.value.body["code"] == nobodys.value.body["code"] == "model_not_found"
    assert theirs.value.body["message"].replace("alice", "X") == nobodys.value.body["message"].replace("nobody", "X")


def test_bobs_list_omits_alices_variant_and_a_user_without_one_sees_the_base(keyed):
    url, keys, _ = keyed
    assert [m.id for m in _client(url, keys["bob"]).models.list().data] == ["tiny", "tiny:bob"]
    carol = _client(url, keys["carol"])
    assert [m.id for m in carol.models.list().data] == ["tiny"]
    assert _ask(carol, "tiny")


def test_the_admin_sees_and_uses_every_variant(keyed):
    url, keys, _ = keyed
    admin = _client(url, keys["admin"])
    assert {m.id for m in admin.models.list().data} == {"tiny", "tiny:alice", "tiny:bob"}
    assert _ask(admin, "tiny:alice") == _ask(_client(url, keys["alice"]), "tiny:alice")


def test_every_route_but_health_needs_a_key_once_the_store_has_one(keyed):
    url, keys, _ = keyed
    for bad in ("", "sk-gym-not-a-key"):
        with pytest.raises(openai.AuthenticationError):
            _client(url, bad or "none").models.list()
    for path in ("/v1/models", "/v1/models/tiny", "/v1/files", "/openapi.json", "/docs", "/redoc"):
        assert _get(url, path) == 401, path
    assert _get(url, "/health") == 200  # load balancers probe it; it names the base model and the load only
    assert _get(url, "/openapi.json", keys["bob"]) == 200


def test_a_shared_api_key_is_an_admin_key_beside_the_stores_keys(keyed, variant_store, variant_chat, serve_app):
    _, keys, _ = keyed
    url = serve_app(variant_chat, service=open_service(variant_store.root), api_key="shared-secret")
    assert {m.id for m in _client(url, "shared-secret").models.list().data} == {"tiny", "tiny:alice", "tiny:bob"}
    assert [m.id for m in _client(url, keys["bob"]).models.list().data] == ["tiny", "tiny:bob"]
    with pytest.raises(openai.AuthenticationError):
        _client(url, "wrong").models.list()


def test_tokenize_checks_the_model_as_chat_does(keyed):
    url, keys, _ = keyed
    body = json.dumps({"model": "tiny:alice", "prompt": "hi"}).encode()
    for who, status in (("bob", 404), ("alice", 200)):
        request = urllib.request.Request(f"{url}/tokenize", data=body, headers={
            "Authorization": f"Bearer {keys[who]}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                got = response.status
        except urllib.error.HTTPError as error:
            got = error.code
        assert got == status, who
