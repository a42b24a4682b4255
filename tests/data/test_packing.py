from __future__ import annotations

import torch

from gym.data.collators import CausalLMCollator, block_causal_mask
from gym.data.packing import pack
from gym.train.trainer import supervised_lm_loss


def _example(n, start):
    ids = list(range(start, start + n))
    return {"input_ids": ids, "labels": [-100] + ids[1:]}


def test_pack_respects_capacity_and_keeps_every_example():
    examples = [_example(n, 10 * i) for i, n in enumerate([7, 3, 5, 2, 8, 1])]
    rows = pack(examples, capacity=10)
    assert all(len(r["input_ids"]) <= 10 for r in rows)
    assert sorted(sum((r["seq_lens"] for r in rows), [])) == [1, 2, 3, 5, 7, 8]
    assert len(rows) == 3  # 26 tokens, best fit -> 3 rows of 10
    for r in rows:
        assert r["position_ids"] == sum((list(range(n)) for n in r["seq_lens"]), [])


def test_block_mask_is_causal_within_and_blocked_across():
    mask = block_causal_mask([[2, 3]], 6)[0, 0]
    allowed = mask == 0
    assert allowed[1, 0] and not allowed[0, 1]  # causal
    assert not allowed[2, 1] and allowed[4, 2]  # sample 2 cannot see sample 1
    assert allowed[5, 5] and not allowed[5, 4]  # padding is its own block: no fully masked row


def test_packed_batch_gives_each_sample_its_loss_alone(tiny_model_dir):
    """The property packing must keep: packing changes speed, never what a sample learns from."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    samples = [_example(n, 100 + 50 * i) for i, n in enumerate([9, 5, 12])]
    collate = CausalLMCollator(pad_token_id=0)
    with torch.no_grad():
        alone = []
        for s in samples:
            batch = collate([s])
            batch.pop("num_tokens")
            labels = batch.pop("labels")
            alone.append(supervised_lm_loss(model, batch, labels, num_items_in_batch=1).item())  # sum over tokens
        packed = collate(pack(samples, capacity=32))
        packed.pop("num_tokens")
        labels = packed.pop("labels")
        packed_sum = supervised_lm_loss(model, packed, labels, num_items_in_batch=1).item()
        # per-sample: compare token-level losses by masking the other samples' labels
        per_sample = []
        offset = 0
        for s in samples:
            only = torch.full_like(labels, -100)
            n = len(s["input_ids"])
            only[0, offset : offset + n] = labels[0, offset : offset + n]
            per_sample.append(supervised_lm_loss(model, dict(packed), only, num_items_in_batch=1).item())
            offset += n
    assert len(pack(samples, capacity=32)) == 1
    for a, b in zip(alone, per_sample):
        assert abs(a - b) < 1e-4, (alone, per_sample)
    assert abs(packed_sum - sum(alone)) < 1e-3


def test_without_the_mask_samples_would_leak(tiny_model_dir):
    """Guards the test above: restarting position_ids alone is not enough with sdpa."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    samples = [_example(6, 100), _example(6, 300)]
    packed = CausalLMCollator(pad_token_id=0)(pack(samples, capacity=12))
    with torch.no_grad():
        second_alone = model(torch.tensor([samples[1]["input_ids"]])).logits[0]
        no_mask = model(packed["input_ids"], position_ids=packed["position_ids"]).logits[0, 6:]
        with_mask = model(packed["input_ids"], position_ids=packed["position_ids"],
                          attention_mask=packed["attention_mask"]).logits[0, 6:]
    assert (with_mask - second_alone).abs().max() < 1e-4
    assert (no_mask - second_alone).abs().max() > 1e-3
