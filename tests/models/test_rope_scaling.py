"""rope_scaling + model_max_length: the config changes as asked, linear scaling is exactly position
interpolation, and a model generates past the context it was built for."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gym.config.parser import get_train_args
from gym.core.errors import ModelError
from gym.models.loader import load_causal_lm

CONTEXT = 32  # the short model's own context


@pytest.fixture(scope="module")
def short_model_dir(tmp_path_factory, tiny_model_dir) -> Path:
    """The tiny model, built for a 32-token context."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(tiny_model_dir)
    config.max_position_embeddings = CONTEXT
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, config=config)
    path = tmp_path_factory.mktemp("short")
    model.save_pretrained(path)
    return path


def _load(path: Path, **keys):
    args = get_train_args({"model_name_or_path": str(path), **keys})
    return load_causal_lm(str(path), args.model).eval()


def test_linear_scaling_is_position_interpolation(short_model_dir):
    plain = _load(short_model_dir)
    scaled = _load(short_model_dir, rope_scaling="linear", model_max_length=2 * CONTEXT)
    assert scaled.config.rope_parameters["factor"] == 2.0 and scaled.config.max_position_embeddings == 2 * CONTEXT
    ids = torch.randint(0, 1000, (1, 12))
    positions = torch.arange(12)[None]
    with torch.no_grad():
        at_double = scaled(ids, position_ids=2 * positions).logits
        at_single = plain(ids, position_ids=positions).logits
    torch.testing.assert_close(at_double, at_single, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["linear", "dynamic", "yarn", "llama3"])
def test_generates_past_the_original_context(short_model_dir, kind):
    scaled = _load(short_model_dir, rope_scaling=kind, model_max_length=4 * CONTEXT)
    assert scaled.config.rope_parameters["rope_type"] == kind
    assert scaled.model.rotary_emb.rope_type == kind
    prompt = torch.randint(0, 1000, (1, CONTEXT + 8))  # already longer than the model was built for
    with torch.no_grad():
        out = scaled.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16, do_sample=False,
                              pad_token_id=0)
        logits = scaled(out).logits
    assert out.shape[1] == CONTEXT + 24 and torch.isfinite(logits).all()
    if kind != "dynamic":  # dynamic changes its frequencies only once the input outgrows the context
        plain = _load(short_model_dir)
        assert not torch.allclose(plain.model.rotary_emb.inv_freq * plain.model.rotary_emb.attention_scaling,
                                  scaled.model.rotary_emb.inv_freq * scaled.model.rotary_emb.attention_scaling)


def test_model_max_length_defaults_to_cutoff_len(short_model_dir):
    args = get_train_args({"model_name_or_path": str(short_model_dir), "rope_scaling": "linear", "cutoff_len": 96})
    assert args.model.model_max_length == 96
    assert load_causal_lm(str(short_model_dir), args.model).config.rope_parameters["factor"] == 3.0


def test_scaling_that_would_not_extend_is_refused(short_model_dir):
    with pytest.raises(ModelError, match="past the model's own 32 tokens"):
        _load(short_model_dir, rope_scaling="yarn", model_max_length=CONTEXT)
