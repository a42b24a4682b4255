"""`gym variants` and `gym export --variant` as docs/personalization.md writes them (issue #39): training keys
after the options, and an adapter variant exported as its base with the adapter merged."""

from __future__ import annotations

import json
import re

import pytest
import torch
from transformers import AutoModelForCausalLM

from gym.cli import main
from gym.delta.apply import save_model_folder
from gym.delta.weights import load_model
from gym.personalization.store import VariantRecord, VariantStore, now

from .test_hostile_store import make_adapter, make_delta


# -- 7. key=value anywhere, as `gym train` takes them ----------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["--user", "u", "--data", "{rows}", "max_steps=30", "cutoff_len=64"],  # as the docs write it
    ["max_steps=30", "--user", "u", "cutoff_len=64", "--data", "{rows}"],
    ["--user", "u", "max_steps=30", "--data", "{rows}", "--cutoff_len", "64"],
])
def test_create_takes_training_keys_anywhere(argv, tmp_path, monkeypatch):
    from gym.personalization.trainer import PersonalizedTrainer

    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps([{"instruction": "Hi.", "output": "Hello."}]))
    seen = {}

    def create_variant(self, user_id, data=None, preferences=None, *, replace_existing=False, safety_gate=None,
                       **overrides):
        seen.update(user=user_id, data=data, overrides=overrides)
        return VariantRecord(user_id, {}, "bitdelta", 1, now(), 0.0)

    monkeypatch.setattr(PersonalizedTrainer, "create_variant", create_variant)
    args = [a.replace("{rows}", str(rows)) for a in argv]
    assert main(["variants", "create", str(tmp_path / "store"), *args]) == 0
    assert seen["user"] == "u" and seen["data"] == [{"instruction": "Hi.", "output": "Hello."}]
    assert seen["overrides"] == {"max_steps": 30, "cutoff_len": 64}


def test_create_still_refuses_what_is_not_a_key(tmp_path, capsys):
    assert main(["variants", "create", str(tmp_path / "store"), "--user", "u", "--data", "x.json", "stray"]) == 2
    assert "stray" in capsys.readouterr().err
    assert main(["variants", "list", str(tmp_path / "store"), "max_steps=3"]) == 2  # the other verbs take no keys
    assert "unrecognized arguments: max_steps=3" in capsys.readouterr().err


@pytest.mark.parametrize(("extra", "message"), [
    (["--adapter", "saves/alice"], "to store an adapter made elsewhere, use `gym variants add .* --user u --adapter"),
    (["--replac"], "Unknown config key 'replac'. Did you mean '--replace'?"),
    (["--max_stepz", "3"], "Did you mean 'max_steps'?"),
    (["distill_steps=2"], "Did you mean '--distill-steps'?"),
    (["delta_distill_steps=2"], "delta_distill_steps: gym variants create stores every variant as BitDelta; its "
                                "distillation is --distill-steps N"),
])
def test_create_names_a_flag_it_does_not_take_before_anything_trains(extra, message, tmp_path, capsys):
    """A flag create lacks lands among the training keys: it is named at once, against create's own flags too
    (the README had given `create --adapter`, which only `add` takes)."""
    assert main(["variants", "create", str(tmp_path / "store"), "--user", "u", "--data", "x.json", *extra]) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "store").exists()


# -- 8. an adapter variant exports as base + adapter -----------------------------------------------------------------
@pytest.mark.slow
def test_export_of_an_adapter_variant_is_its_base_with_the_adapter_merged(tiny_model_dir, tmp_path, capsys):
    store = tmp_path / "store"
    adapter = make_adapter(tiny_model_dir, tmp_path / "adapter")
    VariantStore(store).add("dave", adapter=adapter)
    VariantStore(store).add("alice", delta=make_delta(tiny_model_dir, tmp_path / "alice.safetensors"))
    assert main(["export", "--variant", f"{store}:dave", "--export_dir", str(tmp_path / "dave-hf"),
                 "--export_dtype", "float32"]) == 0, capsys.readouterr().err
    expected = save_model_folder(load_model(str(adapter), str(tiny_model_dir)), str(tiny_model_dir),
                                 tmp_path / "merged", {})
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "dave-hf").state_dict()
    merged = AutoModelForCausalLM.from_pretrained(expected).state_dict()
    assert exported.keys() == merged.keys()
    assert all(torch.equal(exported[k], merged[k]) for k in merged)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    assert not torch.equal(exported["model.layers.0.self_attn.q_proj.weight"],
                           base["model.layers.0.self_attn.q_proj.weight"])  # the adapter is in it
    # `gym variants export` of the same variant writes the same weights.
    assert main(["variants", "export", str(store), "--user", "dave", "-o", str(tmp_path / "dave-cli")]) == 0
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "dave-cli").state_dict()
    assert all(torch.equal(again[k], merged[k]) for k in merged)
