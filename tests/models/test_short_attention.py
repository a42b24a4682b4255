"""Short half-precision training attention on CPU: equals transformers' sdpa (float64) within bf16's bound, with
every mask form transformers hands it; stays finite on rows with nothing to attend; leaves every other call to
transformers' own function; and is what a model loaded by Gym attends with."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import AttentionInterface, AutoModelForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from gym.models import short_attention
from gym.models.loader import load_causal_lm

GQA = SimpleNamespace(training=True, num_key_value_groups=2, is_causal=True)


def _inputs(batch=2, length=11, seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, 4, length, 16, generator=g).to(dtype).requires_grad_()
    key = torch.randn(batch, 2, length, 16, generator=g).to(dtype).requires_grad_()
    value = torch.randn(batch, 2, length, 16, generator=g).to(dtype).requires_grad_()
    return query, key, value


def _padding_mask(length: int) -> torch.Tensor:
    """[2, 1, T, T], True = may attend: causal, and the second row's last three positions are padding."""
    allowed = torch.ones(length, length, dtype=torch.bool).tril().repeat(2, 1, 1, 1)
    allowed[1, :, :, -3:] = False
    return allowed


@pytest.mark.parametrize("form", ["causal, no mask", "bool padding mask", "additive padding mask", "not causal"])
def test_equals_transformers_sdpa_in_float64_within_bf16s_bound(form):
    query, key, value = _inputs()
    length = query.shape[2]
    module = SimpleNamespace(**{**vars(GQA), "is_causal": form != "not causal"})
    mask = None
    if form == "bool padding mask":
        mask = _padding_mask(length)
    elif form == "additive padding mask":
        mask = torch.zeros(2, 1, length, length).masked_fill(~_padding_mask(length), torch.finfo(torch.float32).min)
    assert short_attention.takes_plain_ops(module, query, key, value)

    out, _ = short_attention.attention(module, query, key, value, mask.to(query.dtype) if form.startswith("add")
                                       else mask)
    wide = [t.detach().double().requires_grad_() for t in (query, key, value)]
    reference, _ = sdpa_attention_forward(module, *wide, None if mask is None else
                                          (mask if mask.dtype == torch.bool else mask.double()))
    if form == "bool padding mask" or form == "additive padding mask":
        out, reference = out[:, :-3], reference[:, :-3]  # padding queries' outputs are never read
    torch.testing.assert_close(out.double(), reference, atol=2e-2, rtol=2e-2)
    out.float().square().sum().backward()
    reference.square().sum().backward()
    for ours, exact in zip((query, key, value), wide):
        torch.testing.assert_close(ours.grad.double(), exact.grad, atol=5e-2, rtol=5e-2)


def test_a_row_with_nothing_to_attend_stays_finite():
    query, key, value = _inputs()
    mask = _padding_mask(query.shape[2])
    mask[1, :, -3:] = False  # the padding queries attend nothing at all
    out, _ = short_attention.attention(GQA, query, key, value, mask)
    out.float().sum().backward()
    assert torch.isfinite(out).all()
    assert all(torch.isfinite(t.grad).all() for t in (query, key, value))


@pytest.mark.parametrize("case", ["float32", "longer than 128", "too many scores", "a cache"])
def test_every_other_call_is_transformers_own(case, monkeypatch):
    length = {"longer than 128": 129, "too many scores": 128}.get(case, 11)
    batch = 130 if case == "too many scores" else 2  # 130 x 4 heads x 128^2 > 2^23 scores
    query, key, value = _inputs(batch, length, dtype=torch.float32 if case == "float32" else torch.bfloat16)
    if case == "a cache":
        query = query[:, :, -1:]
    calls = []
    monkeypatch.setattr(short_attention, "sdpa_attention_forward", lambda *a, **k: calls.append(1) or (None, None))
    assert not short_attention.takes_plain_ops(GQA, query, key, value)
    short_attention.attention(GQA, query, key, value, None)
    assert calls == [1]


def test_a_reference_without_gradients_attends_as_the_policy_with_them():
    """DPO's, KTO's and NPO's loss at the first step needs the reference's numbers to equal the policy's."""
    query, key, value = _inputs()
    mask = _padding_mask(query.shape[2])
    with torch.no_grad():
        reference, _ = short_attention.attention(GQA, query, key, value, mask)
    policy, _ = short_attention.attention(GQA, query, key, value, mask)
    assert policy.requires_grad and torch.equal(policy.detach(), reference)


def test_a_model_gym_loads_attends_with_it_and_trains_as_eager_does(tiny_model_dir):
    ids = torch.randint(0, 1000, (3, 20), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[0, -6:] = 0

    def loss_and_grad(model):
        model.train()
        loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
        loss.backward()
        return loss.detach(), model.model.layers[1].self_attn.q_proj.weight.grad

    AttentionInterface.register("sdpa", sdpa_attention_forward)  # whatever an earlier test left
    ours = load_causal_lm(str(tiny_model_dir), None, dtype=torch.bfloat16)
    assert ours.config._attn_implementation == "sdpa"  # a saved model still says sdpa
    assert AttentionInterface._global_mapping["sdpa"] is short_attention.attention
    eager = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16, attn_implementation="eager")
    # The same operations as transformers' eager attention, in the same order: the same bits.
    for a, b in zip(loss_and_grad(ours), loss_and_grad(eager)):
        assert torch.equal(a, b)
