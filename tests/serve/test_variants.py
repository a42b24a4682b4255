"""`gym api --variants`: one base, its users' variants answering as "<base>:<user>" in the same batches.
Each variant's greedy answer equals its merged model's (gym delta apply / PEFT merge); variants added
while the server runs are served without a restart; a deleted one 404s while its running request ends."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import torch
from peft import LoraConfig, get_peft_model
from tests.conftest import bitdelta
from transformers import AutoModelForCausalLM

from gym.delta.apply import save_model_folder, write_applied
from gym.infer.chat import ChatModel
from gym.infer.fast.bank import VariantNotFound
from gym.personalization.source import StoreSource
from gym.personalization.store import VariantStore

HELLO = [{"role": "user", "content": "Say hello."}]
SETTINGS = {"infer_dtype": "float32", "max_new_tokens": 10}


def _base(path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _adapter(tiny_model_dir, folder):
    torch.manual_seed(5)
    targets = ["q_proj", "v_proj", "up_proj", "down_proj"]
    lora = get_peft_model(_base(tiny_model_dir), LoraConfig(r=4, lora_alpha=16, target_modules=targets))
    with torch.no_grad():
        for name, param in lora.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 1.0)
    lora.save_pretrained(folder / "adapter")
    return folder / "adapter"


@pytest.fixture(scope="module")
def served(tiny_model_dir, tmp_path_factory, serve_app):
    folder = tmp_path_factory.mktemp("store")
    store = VariantStore(folder / "store")
    deltas = {seed: bitdelta(tiny_model_dir, folder, seed) for seed in (1, 2)}
    adapter = _adapter(tiny_model_dir, folder)
    store.add("alice", delta=deltas[1])
    store.add("bob@example.com", adapter=adapter)
    chat = ChatModel({"model_name_or_path": str(tiny_model_dir), **SETTINGS}, max_batch_size=8,
                     variants=StoreSource(store))
    url = serve_app(chat, "tiny")
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)
    merged = {"alice": write_applied(str(tiny_model_dir), deltas[1], folder / "alice-merged"),
              "carol": write_applied(str(tiny_model_dir), deltas[2], folder / "carol-merged")}
    from gym.delta.weights import load_model
    merged["bob@example.com"] = save_model_folder(load_model(str(adapter), str(tiny_model_dir)), str(tiny_model_dir),
                                                  folder / "bob-merged", {})
    yield store, chat, client, merged, deltas
    chat.close()


def _reference(model_dir) -> str:
    chat = ChatModel({"model_name_or_path": str(model_dir), **SETTINGS})
    try:
        return chat.chat(HELLO, do_sample=False)
    finally:
        chat.close()


def _ask(client, model: str) -> str:
    response = client.chat.completions.create(model=model, messages=HELLO, temperature=0, max_tokens=10)
    return response.choices[0].message.content


def test_models_lists_the_base_and_every_variant(served):
    _, _, client, _, _ = served
    listed = {m.id: m for m in client.models.list().data}
    assert set(listed) == {"tiny", "tiny:alice", "tiny:bob@example.com"}
    assert listed["tiny:alice"].model_extra["parent"] == "tiny"
    assert client.models.retrieve("tiny:alice").id == "tiny:alice"


def test_a_response_names_the_model_it_was_asked_for(served):
    """OpenAI echoes the requested model: a client keying its logs or caches on `model` must see the variant."""
    _, _, client, _, _ = served
    assert client.chat.completions.create(model="tiny:alice", messages=HELLO, max_tokens=2).model == "tiny:alice"
    chunks = list(client.chat.completions.create(model="tiny:alice", messages=HELLO, max_tokens=2, stream=True))
    assert {chunk.model for chunk in chunks} == {"tiny:alice"}
    assert client.completions.create(model="tiny:alice", prompt="Hi", max_tokens=2).model == "tiny:alice"
    assert client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=2).model == "tiny"


def test_each_variant_answers_as_its_merged_model_in_one_mixed_batch(served, tiny_model_dir):
    _, _, client, merged, _ = served
    models = ["tiny", "tiny:alice", "tiny:bob@example.com"] * 2
    with ThreadPoolExecutor(len(models)) as pool:  # concurrent: they share decode steps
        answers = list(pool.map(lambda m: _ask(client, m), models))
    want = {"tiny": _reference(tiny_model_dir), "tiny:alice": _reference(merged["alice"]),
            "tiny:bob@example.com": _reference(merged["bob@example.com"])}
    assert len(set(want.values())) == 3  # the variants really answer differently
    assert answers == [want[m] for m in models]


@pytest.mark.parametrize("name", ["tiny:nobody", "tiny:../alice", "other:alice", "tiny:"])
def test_unknown_models_are_404(served, name):
    _, _, client, _, _ = served
    with pytest.raises(openai.NotFoundError) as caught:
        _ask(client, name)
    assert caught.value.body["code"] == "model_not_found"


def test_a_variant_added_while_serving_is_served_and_a_deleted_one_404s_after_its_request_ends(served):
    store, chat, client, merged, deltas = served
    store.add("carol", delta=deltas[2])
    assert "tiny:carol" in {m.id for m in client.models.list().data}
    assert _ask(client, "tiny:carol") == _reference(merged["carol"])
    running = chat.engine.submit(chat.render(HELLO), chat.sampling_params(do_sample=False, max_new_tokens=40,
                                                                          variant="carol"))
    store.delete("carol")
    *_, finished = running.events()
    assert finished.reason == "length" and finished.completion_tokens == 40
    with pytest.raises(openai.NotFoundError):
        _ask(client, "tiny:carol")
    with pytest.raises(VariantNotFound):
        chat.engine.submit(chat.render(HELLO), chat.sampling_params(variant="carol"))


def test_engines_without_variants_refuse_a_variant_request(tiny_model_dir):
    chat = ChatModel({"model_name_or_path": str(tiny_model_dir), "infer_backend": "hf"})
    try:
        with pytest.raises(ValueError, match="base model only"):
            chat.engine.submit([1, 2, 3], chat.sampling_params(variant="alice"))
    finally:
        chat.close()
