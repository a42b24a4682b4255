"""Attention kernels: shift_attn (LongLoRA's S²-Attn) equals attention under its group masks and never sees the
future; flash_attn/liger/unsloth choices this CPU cannot run are config errors naming what is missing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from gym.config.parser import get_train_args
from gym.core.errors import ConfigError
from gym.models.attention import GROUP_RATIO, shifted_sparse_attention
from gym.models.loader import load_causal_lm


def _reference(query, key, value, heads_shifted_from: int, size: int) -> torch.Tensor:
    """Plain attention with S²-Attn's pattern as an explicit [H, T, T] mask: causal, and within a group (for the
    shifted heads, groups offset by half a group, the sequence's end and start in separate groups)."""
    heads, length = query.shape[1], query.shape[2]
    positions = torch.arange(length)
    padded = -(-length // size) * size
    plain_group = positions // size
    shifted_group = ((positions - size // 2) % padded) // size
    causal = positions[None, :] <= positions[:, None]
    masks = []
    for head in range(heads):
        group = shifted_group if head >= heads_shifted_from else plain_group
        masks.append(causal & (group[None, :] == group[:, None]))
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=torch.stack(masks))


@pytest.mark.parametrize("length", [16, 21])  # a multiple of the group size, and not
def test_shifted_sparse_attention_equals_its_masked_reference(length):
    torch.manual_seed(0)
    module = SimpleNamespace(training=True, num_key_value_groups=2)
    query = torch.randn(2, 4, length, 8, requires_grad=True)
    key, value = torch.randn(2, 2, length, 8), torch.randn(2, 2, length, 8)
    out, _ = shifted_sparse_attention(module, query, key, value, None)
    size = -(-length // int(1 / GROUP_RATIO))
    expected = _reference(query, key.repeat_interleave(2, 1), value.repeat_interleave(2, 1), 2, size)
    torch.testing.assert_close(out, expected.transpose(1, 2), atol=1e-5, rtol=1e-5)
    # No token sees its future: the first output does not depend on any later query, key or value.
    out[:, 0].sum().backward()
    assert query.grad is not None and query.grad[:, :, 1:].abs().sum() == 0


def test_evaluation_attends_in_full(tiny_model_dir):
    args = get_train_args({"model_name_or_path": str(tiny_model_dir), "shift_attn": True})
    shifted = load_causal_lm(str(tiny_model_dir), args.model)
    plain = load_causal_lm(str(tiny_model_dir))
    assert shifted.config._attn_implementation == "gym_shifted_sparse"
    ids = torch.randint(0, 1000, (1, 40))
    with torch.no_grad():
        torch.testing.assert_close(shifted.eval()(ids).logits, plain.eval()(ids).logits)
        # In training mode a late token no longer sees the start of the sequence: its logits change.
        assert not torch.allclose(shifted.train()(ids).logits[0, -1], plain.train()(ids).logits[0, -1], atol=1e-4)


def test_training_with_shift_attn(train_config):
    from gym.workflows.training import run_exp

    result = run_exp(train_config(shift_attn=True, max_steps=4))
    assert result.global_step == 4 and result.final_loss is not None


def test_auto_is_sdpa_on_this_cpu(tiny_model_dir):
    if torch.cuda.is_available():
        pytest.skip("on a CUDA machine auto may pick flash-attn 2")
    for choice, expected in (("auto", "sdpa"), ("sdpa", "sdpa"), ("eager", "eager"), ("disabled", "eager")):
        args = get_train_args({"model_name_or_path": str(tiny_model_dir), "flash_attn": choice})
        assert load_causal_lm(str(tiny_model_dir), args.model).config._attn_implementation == expected


@pytest.mark.skipif(torch.cuda.is_available(), reason="these are the errors of a machine without a GPU")
@pytest.mark.parametrize(("keys", "message"), [
    ({"flash_attn": "fa2"}, "flash_attn: fa2 needs a CUDA GPU"),
    ({"flash_attn": "fa3"}, "flash_attn: fa3 needs a CUDA GPU"),
    ({"enable_liger_kernel": True}, "needs a CUDA GPU: Liger's kernels are Triton"),
    ({"use_unsloth": True}, "'use_unsloth' needs a CUDA GPU"),
])
def test_gpu_kernels_on_this_cpu_are_config_errors(keys, message):
    with pytest.raises(ConfigError, match=message):
        get_train_args(keys)


@pytest.mark.parametrize(("keys", "message"), [
    ({"shift_attn": True, "packing": True}, "turn packing off"),
    ({"shift_attn": True, "flash_attn": "eager"}, "cannot run with flash_attn: eager"),
])
def test_shift_attn_conflicts_are_config_errors(keys, message):
    with pytest.raises(ConfigError, match=message):
        get_train_args(keys)
