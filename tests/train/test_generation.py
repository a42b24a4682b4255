"""LoRA merged while sampling: the same distribution inside, the same model after."""

from __future__ import annotations

import torch

from gym.train.generation import merged_lora


def test_merged_lora_samples_from_the_same_model_and_restores_it(tiny_model_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                           LoraConfig(r=4, target_modules=["q_proj", "down_proj"])).eval()
    with torch.no_grad():  # a trained-looking adapter, so that merging really changes the weights
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.5)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids = torch.tensor([[5, 17, 99, 1000, 23, 7]])
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        with merged_lora(model):
            assert all(m.merged for m in model.modules() if hasattr(m, "merged_adapters"))
            merged = model(input_ids=ids).logits
            base_q = model.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight
            original = before["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"]
            assert not torch.allclose(base_q, original)
    assert torch.allclose(merged, expected, atol=1e-5)
    assert not any(m.merged for m in model.modules() if hasattr(m, "merged_adapters"))
    after = dict(model.named_parameters())
    assert all(torch.allclose(after[n], p, atol=1e-6) for n, p in before.items())


def test_merged_lora_leaves_a_plain_model_alone(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with merged_lora(model):  # nothing to merge: no error, no change
        assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
