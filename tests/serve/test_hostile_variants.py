"""`gym api --variants` against what a hostile pass found (issue #39): a variant the server cannot load answers a
4xx naming it while the base and the other users keep answering, and no string a client sends (the model's name
included) turns into a 500."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest

from gym.infer.chat import ChatModel
from gym.personalization.source import StoreSource
from gym.personalization.store import VariantStore

from ..personalization.test_hostile_store import make_adapter, make_base, make_delta, poisoned
from .test_app import HELLO, raw

SETTINGS = {"infer_dtype": "float32", "max_new_tokens": 6}


@pytest.fixture(scope="module")
def server(tiny_model_dir, tokenizer, tmp_path_factory, serve_app):
    """tiny + alice (a good delta) and bob (a good adapter); carol and erin were added whole, and their files were
    then damaged on disk (a NaN delta; an adapter of a wider base), before the server first loaded them."""
    folder = tmp_path_factory.mktemp("hostile-store")
    store = VariantStore(folder / "store")
    good = make_delta(tiny_model_dir, folder / "good.safetensors")
    adapter = make_adapter(tiny_model_dir, folder / "adapter")
    store.add("alice", delta=good)
    store.add("bob", adapter=adapter)
    store.add("carol", delta=good)
    store.add("erin", adapter=adapter)
    shutil.copyfile(poisoned(good, folder / "nan.safetensors"), store.delta_path("carol"))
    wide = make_adapter(make_base(tokenizer, folder / "wide", seed=2, hidden=96), folder / "wide-adapter")
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        shutil.copyfile(wide / name, store.adapter_path("erin") / name)
    chat = ChatModel({"model_name_or_path": str(tiny_model_dir), **SETTINGS}, max_batch_size=8,
                     variants=StoreSource(store))
    yield serve_app(chat, "tiny")
    chat.close()


def _chat(url: str, model: str) -> tuple[int, dict]:
    body = {"model": model, "messages": HELLO, "temperature": 0, "max_tokens": 4}
    return raw(url, "/v1/chat/completions", json.dumps(body).encode(), key=None)


@pytest.mark.parametrize("broken", ["tiny:carol", "tiny:erin"])
def test_a_variant_that_cannot_load_is_a_4xx_naming_it_and_stops_no_one(server, broken):
    with ThreadPoolExecutor(6) as pool:  # the broken variant's requests share the engine with everyone else's
        answers = list(pool.map(lambda m: (m, _chat(server, m)), [broken, "tiny", "tiny:alice", "tiny:bob"] * 2))
    for model, (status, body) in answers:
        if model == broken:
            assert status == 400, body
            assert broken in body["error"]["message"] and body["error"]["param"] == "model"
            assert body["error"]["code"] == "model_not_loadable"
        else:
            assert status == 200, (model, body)
            assert body["choices"][0]["message"]["content"] is not None
    status, body = raw(server, "/v1/completions", json.dumps({"model": broken, "prompt": "Hi", "max_tokens": 2})
                       .encode(), key=None)
    assert status == 400 and broken in body["error"]["message"]
    assert _chat(server, "tiny:alice")[0] == 200  # and after it, too


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"model": "tiny:\ud800", "messages": HELLO}),
    ("/v1/chat/completions", {"model": "\udfff", "messages": HELLO}),
    ("/v1/completions", {"model": "tiny:\ud800", "prompt": "Hi"}),
    ("/tokenize", {"model": "tiny:\ud800", "prompt": "Hi"}),
    ("/v1/chat/completions", {"model": "tiny", "messages": HELLO, "stream_options": {"x\ud800": 1}}),
    ("/v1/chat/completions", {"model": "tiny", "messages": HELLO, "tools": [{"name": "\ud800"}]}),
])
def test_a_lone_surrogate_in_any_string_field_is_a_400(server, path, body):
    status, answer = raw(server, path, json.dumps(body).encode(), key=None)  # json.dumps writes it as \ud800
    assert status == 400, answer
    assert "surrogate" in answer["error"]["message"]


def test_a_surrogate_in_a_model_path_is_not_a_500(server):
    status, answer = raw(server, "/v1/models/tiny:%ED%A0%80", key=None)
    assert status == 404 and answer["error"]["code"] == "model_not_found"
