"""`logits_to_keep` as index tensors: the loss's forward projects nothing beyond the labelled rows, and the last
positions as indices give the logits an int gives."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from gym.models.logit_positions import last_positions, no_positions
from gym.train.trainer import supervised_lm_loss


def _frozen(tiny_model_dir, dtype=torch.float32):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=dtype)
    return model.requires_grad_(False).eval()


def test_the_loss_runs_the_head_on_the_labelled_positions_only(tiny_model_dir):
    model = _frozen(tiny_model_dir, torch.bfloat16)
    projected: list[tuple[int, ...]] = []
    model.get_output_embeddings().register_forward_hook(lambda _m, args, _out: projected.append(tuple(args[0].shape)))
    ids = torch.randint(0, 1000, (3, 12), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[:, :7] = -100  # a prompt of 7 tokens: 5 labelled targets a row after the shift
    supervised_lm_loss(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, labels)
    hidden = model.config.hidden_size
    # The model's own call projects no position (with logits_to_keep=1 it projected each row's last one, and
    # its sliced rows copied the head's weight once per row); the loss projects the 15 labelled ones.
    assert projected == [(3, 0, hidden), (15, hidden)]


def test_last_positions_are_what_an_int_keeps(tiny_model_dir):
    model = _frozen(tiny_model_dir)
    ids = torch.randint(0, 1000, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        by_int = model(input_ids=ids, logits_to_keep=4).logits
        by_index = model(input_ids=ids, logits_to_keep=last_positions(4, 9, ids.device)).logits
    assert by_index.shape == (2, 4, model.config.vocab_size)
    torch.testing.assert_close(by_index, by_int)
    assert last_positions(12, 9, "cpu").tolist() == list(range(9))  # more than there are: all of them
    assert no_positions("cpu").numel() == 0
