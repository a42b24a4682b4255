from __future__ import annotations

import torch

from gym.train.trainer import supervised_lm_loss


def test_loss_matches_the_models_own_loss(tiny_model_dir):
    """Projecting only labelled positions must give exactly the standard shifted cross-entropy."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    torch.manual_seed(0)
    ids = torch.randint(5, 1000, (2, 12))
    labels = ids.clone()
    labels[:, :5] = -100
    labels[1, 9:] = -100
    mask = torch.ones_like(ids)
    reference = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    ours = supervised_lm_loss(model, {"input_ids": ids, "attention_mask": mask}, labels)
    assert torch.allclose(ours, reference, atol=1e-5)
    ours.backward()
    assert model.model.embed_tokens.weight.grad is not None
