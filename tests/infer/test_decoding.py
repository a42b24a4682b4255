"""One set of decoding defaults for chat, the API and batch inference: the user's keys (or those training
saved), else the model's own generation_config.json, else Gym's DECODING_DEFAULTS."""

from __future__ import annotations

import json
import shutil
from dataclasses import fields

import pytest

from gym.config.generating import DECODING_DEFAULTS, GeneratingArguments
from gym.infer.chat import ChatModel
from gym.infer.requests import SamplingParams
from gym.models.loader import generation_defaults


@pytest.fixture()
def qwen_like(tiny_model_dir, tmp_path):
    """The tiny model with a generation_config.json that asks for its own sampling, as Qwen3's does."""
    folder = tmp_path / "qwen-like"
    shutil.copytree(tiny_model_dir, folder)
    config = json.loads((folder / "generation_config.json").read_text())
    config.update(do_sample=True, temperature=0.6, top_p=0.95, top_k=20)
    (folder / "generation_config.json").write_text(json.dumps(config))
    return folder


def test_the_engine_and_the_config_share_one_set_of_defaults():
    engine_defaults = {f.name: f.default for f in fields(SamplingParams) if f.name in DECODING_DEFAULTS}
    assert engine_defaults == DECODING_DEFAULTS
    assert GeneratingArguments().resolve() == DECODING_DEFAULTS


def test_the_models_generation_config_comes_before_gyms_defaults(qwen_like):
    assert generation_defaults(str(qwen_like)) == {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20}
    model = ChatModel({"model_name_or_path": str(qwen_like)})
    try:
        assert model.decoding == {**DECODING_DEFAULTS, "temperature": 0.6, "top_p": 0.95, "top_k": 20}
        params = model.sampling_params(seed=3)
        assert (params.temperature, params.top_p, params.top_k, params.seed) == (0.6, 0.95, 20, 3)
        assert model.sampling_params(temperature=0.1).temperature == 0.1  # a request's own setting wins
    finally:
        model.close()


def test_the_users_keys_come_before_the_model(qwen_like):
    model = ChatModel({"model_name_or_path": str(qwen_like), "temperature": 0.2, "do_sample": False})
    try:
        assert model.decoding["temperature"] == 0.2 and model.decoding["do_sample"] is False
        assert model.decoding["top_k"] == 20  # unset by the user: still the model's
        assert model.sampling_params().greedy
    finally:
        model.close()


def test_a_model_without_preferences_gets_gyms_defaults(tiny_model_dir):
    assert generation_defaults(str(tiny_model_dir)) == {}
    model = ChatModel({"model_name_or_path": str(tiny_model_dir)})
    try:
        assert model.decoding == DECODING_DEFAULTS
    finally:
        model.close()


@pytest.mark.parametrize("content", [
    {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_new_tokens": 64, "bos_token_id": 1},
    {"temperature": 1.0, "top_k": 50, "repetition_penalty": 1.0, "do_sample": False},  # transformers' old defaults
    {"temperature": None, "eos_token_id": [1, 2]},
    {},
])
def test_a_folders_generation_config_is_read_as_transformers_reads_it(tmp_path, content):
    """generation_defaults reads a local folder's file itself (no transformers import at a `gym chat` start): what
    transformers' GenerationConfig keeps of it (every decoding default there is None), key for key."""
    from transformers import GenerationConfig

    (tmp_path / "generation_config.json").write_text(json.dumps(content))
    given = GenerationConfig.from_pretrained(tmp_path).to_diff_dict()
    assert generation_defaults(str(tmp_path)) == {k: given[k] for k in ("do_sample", "temperature", "top_p", "top_k",
                                                                       "max_new_tokens", "repetition_penalty")
                                                  if k in given}


def test_a_folder_without_a_readable_generation_config_has_no_preferences(tmp_path):
    assert generation_defaults(str(tmp_path)) == {}
    (tmp_path / "generation_config.json").write_text("{not json")
    assert generation_defaults(str(tmp_path)) == {}
    (tmp_path / "generation_config.json").write_text("[1, 2]")
    assert generation_defaults(str(tmp_path)) == {}
