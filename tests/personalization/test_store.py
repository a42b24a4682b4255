"""The variant store: user ids are names, a variant appears whole or not at all, a concurrent create of
the same user is refused, and a delta from another base is refused by fingerprint."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from gym.core.errors import ConfigError, GymError
from gym.delta.format import save_delta
from gym.personalization.store import (
    DELTA_FILE,
    MANIFEST,
    VariantError,
    VariantRecord,
    VariantStore,
    check_user_id,
    now,
    write_manifest,
)

BASE = {"fingerprint": "a" * 64, "name": "tiny-base"}  # its name is the tiny model's folder, set for each test
NORM = "model.norm.weight"  # a parameter of the tiny base: [64]


@pytest.fixture(autouse=True)
def _base_is_the_tiny_model(tiny_model_dir, monkeypatch):
    """Variants are checked against their base's shapes: BASE names the tiny model's folder."""
    monkeypatch.setitem(BASE, "name", str(tiny_model_dir))


def _variant(store: VariantStore, user: str, base: dict[str, str] = BASE, **options) -> VariantRecord:
    record = VariantRecord(user=user, base=base, method="dense", bytes=0, created=now(), seconds=0.0)
    with store.creating(user, **options) as folder:
        save_delta(folder / DELTA_FILE, {NORM: torch.ones(64)}, {"method": "dense", "base": base})
        record.bytes = (folder / DELTA_FILE).stat().st_size
        write_manifest(folder, record)
    return record


@pytest.mark.parametrize("user", ["", "../evil", "a/b", "a\\b", "..", ".hidden", "x" * 129, "a..b", "tab\tuser",
                                  "new\nline", "/abs"])
def test_hostile_user_ids_are_refused_by_name(user):
    with pytest.raises(ConfigError, match="user id"):
        check_user_id(user)


@pytest.mark.parametrize("user", ["alice", "user_42", "bob.smith@example.com", "A-1+b", "x" * 128])
def test_plain_user_ids_are_accepted(user):
    assert check_user_id(user) == user


def test_a_created_variant_is_listed_read_and_deleted(tmp_path):
    store = VariantStore(tmp_path / "store")
    record = _variant(store, "alice")
    assert store.users() == ["alice"]
    assert store.get("alice") == record
    assert store.base() == BASE
    assert not [p for p in store.root.iterdir() if p.name.startswith(".tmp-")]  # no temporary left behind
    store.delete("alice")
    assert store.users() == []
    with pytest.raises(VariantError, match="No variant for user 'alice'"):
        store.get("alice")


def test_an_existing_variant_is_kept_unless_replaced(tmp_path):
    store = VariantStore(tmp_path)
    _variant(store, "alice")
    with pytest.raises(VariantError, match="already has a variant"):
        _variant(store, "alice")
    _variant(store, "alice", replace=True)
    assert store.users() == ["alice"]


def test_a_failed_create_leaves_nothing_and_releases_the_user(tmp_path):
    store = VariantStore(tmp_path)
    with pytest.raises(RuntimeError), store.creating("alice") as folder:
        (folder / DELTA_FILE).write_bytes(b"half a file")
        raise RuntimeError("training crashed")
    assert store.users() == [] and not (tmp_path / "alice").exists()
    _variant(store, "alice")  # the lock went with the failure
    assert store.users() == ["alice"]


def test_a_truncated_delta_file_is_refused_at_commit(tmp_path):
    store = VariantStore(tmp_path)
    with pytest.raises(GymError), store.creating("alice") as folder:
        save_delta(folder / DELTA_FILE, {"w": torch.ones(64, 64)},
                   {"method": "dense", "base": BASE, "entries": {"w": {"encoding": "dense", "shape": [64, 64]}}})
        data = (folder / DELTA_FILE).read_bytes()
        (folder / DELTA_FILE).write_bytes(data[: len(data) // 2])
        (folder / MANIFEST).write_text("{}")
    assert store.users() == []


def test_a_concurrent_create_of_the_same_user_is_refused(tmp_path):
    store = VariantStore(tmp_path)
    inside, release = threading.Event(), threading.Event()
    errors: list[Exception] = []

    def first() -> None:
        with store.creating("alice") as folder:
            inside.set()
            release.wait(10)
            save_delta(folder / DELTA_FILE, {NORM: torch.ones(64)}, {"method": "dense", "base": BASE})
            write_manifest(folder, VariantRecord("alice", BASE, "dense", 1, now(), 0.0))

    thread = threading.Thread(target=first)
    thread.start()
    assert inside.wait(10)
    try:
        _variant(store, "alice")
    except VariantError as exc:
        errors.append(exc)
    finally:
        release.set()
        thread.join(10)
    assert errors and "being created" in str(errors[0])
    assert store.users() == ["alice"]  # the first create finished, whole
    _variant(store, "bob")  # another user was never blocked


def test_ids_equal_ignoring_case_are_one_user_to_create_and_delete(tmp_path):
    store = VariantStore(tmp_path)
    _variant(store, "alice")
    with pytest.raises(VariantError, match="'Alice' differs from the existing user 'alice' .* only in case"):
        _variant(store, "Alice")  # create_variant's way in
    with pytest.raises(VariantError, match="'ALICE' differs from the existing user 'alice'"):
        store.delete("ALICE")  # where case is ignored, it would have deleted alice's
    assert store.users() == ["alice"] and store.get("alice").user == "alice"


def test_a_store_already_holding_ids_equal_ignoring_case_keeps_both(tmp_path, monkeypatch):
    store = VariantStore(tmp_path)
    _variant(store, "alice")
    with monkeypatch.context() as before_the_rule:
        before_the_rule.setattr(VariantStore, "_refuse_case_twin", lambda *args: None)
        _variant(store, "Alice")
    _variant(store, "Alice", replace=True)
    store.delete("alice")
    assert store.users() == ["Alice"]


def test_a_create_of_an_id_equal_to_one_being_created_ignoring_case_is_refused(tmp_path):
    # Neither is listed yet, so only a lock both take keeps the second out.
    store = VariantStore(tmp_path)
    with store.creating("alice") as folder:
        with pytest.raises(VariantError, match="'Alice' is being created"):
            _variant(store, "Alice")
        save_delta(folder / DELTA_FILE, {NORM: torch.ones(64)}, {"method": "dense", "base": BASE})
        write_manifest(folder, VariantRecord("alice", BASE, "dense", 1, now(), 0.0))
    assert store.users() == ["alice"]


def test_a_variant_of_another_base_is_refused(tmp_path):
    store = VariantStore(tmp_path)
    _variant(store, "alice")
    other = {"fingerprint": "b" * 64, "name": "other-base"}
    with pytest.raises(VariantError, match="other-base.*tiny-llama"):
        _variant(store, "bob", base=other)
    assert store.users() == ["alice"]


def test_an_unreadable_manifest_is_named(tmp_path):
    store = VariantStore(tmp_path)
    _variant(store, "alice")
    (tmp_path / "alice" / MANIFEST).write_text("{not json")
    with pytest.raises(VariantError, match=r"alice.manifest\.json"):
        store.get("alice")
    json.loads((tmp_path / "store.json").read_text())  # the store's own description is intact


def _delta_file(tmp_path, base: dict[str, str] = BASE):
    return save_delta(tmp_path / f"{base['fingerprint']}.safetensors", {NORM: torch.ones(64)},
                      {"method": "bitdelta", "base": base})


def _adapter(tmp_path, **config):
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 4, **config}))
    from safetensors.torch import save_file

    save_file({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.ones(2, 64),
               "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.ones(64, 2)},
              str(folder / "adapter_model.safetensors"))
    return folder


def test_add_puts_a_delta_file_or_an_adapter_in_the_store(tmp_path):
    store = VariantStore(tmp_path / "store")
    record = store.add("alice", delta=_delta_file(tmp_path))
    assert record.method == "bitdelta" and store.delta_path("alice").is_file()
    assert store.base() == BASE
    record = store.add("bob", adapter=_adapter(tmp_path))
    assert record.method == "lora" and (store.adapter_path("bob") / "adapter_model.safetensors").is_file()
    assert store.users() == ["alice", "bob"]
    with pytest.raises(GymError, match="already has a variant"):
        store.add("bob", adapter=tmp_path / "adapter")


def test_add_refuses_another_base_and_adapters_it_cannot_serve(tmp_path):
    store = VariantStore(tmp_path / "store")
    mine = _delta_file(tmp_path)
    store.add("alice", delta=mine)
    other = {"name": "other", "fingerprint": "f" * 64}
    with pytest.raises(GymError, match="fingerprints differ"):
        store.add("eve", delta=_delta_file(tmp_path, other))
    with pytest.raises(ConfigError, match="use_dora"):
        store.add("dora", adapter=_adapter(tmp_path, use_dora=True))
    with pytest.raises(ConfigError, match="one"):
        store.add("both", delta=mine, adapter=tmp_path / "adapter")
    assert store.users() == ["alice"]  # nothing half-added
