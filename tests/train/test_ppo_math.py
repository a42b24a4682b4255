"""PPO's maths against hand-computed numbers."""

from __future__ import annotations

import pytest
import torch

from gym.train.ppo_math import (
    AdaptiveKLController,
    RunningMoments,
    completion_mask,
    compute_gae,
    policy_loss,
    value_loss,
    whiten,
)


def test_gae_matches_hand_computation_and_skips_padding():
    # gamma 0.9, lam 0.8 (gamma*lam = 0.72); the last position is padding holding garbage.
    rewards = torch.tensor([[1.0, 0.0, 2.0, 9.0]])
    values = torch.tensor([[0.5, 1.0, 1.5, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    advantages, returns = compute_gae(rewards, values, mask, gamma=0.9, lam=0.8)
    # t=2: delta = 2 + 0.9*0   - 1.5 = 0.5                      A2 = 0.5
    # t=1: delta = 0 + 0.9*1.5 - 1.0 = 0.35   A1 = 0.35 + 0.72*0.5  = 0.71
    # t=0: delta = 1 + 0.9*1.0 - 0.5 = 1.4    A0 = 1.4  + 0.72*0.71 = 1.9112
    assert advantages[0].tolist() == pytest.approx([1.9112, 0.71, 0.5, 0.0])
    assert returns[0].tolist() == pytest.approx([2.4112, 1.71, 2.0, 0.0])


def test_gae_with_a_masked_position_inside_skips_it():
    # The masked middle token neither gets an advantage nor serves as the next state.
    rewards = torch.tensor([[1.0, 5.0, 2.0]])
    values = torch.tensor([[0.5, 3.0, 1.5]])
    advantages, _ = compute_gae(rewards, values, torch.tensor([[1.0, 0.0, 1.0]]), gamma=0.9, lam=0.8)
    # t=2: A = 2 - 1.5 = 0.5;  t=0: delta = 1 + 0.9*1.5 - 0.5 = 1.85, A = 1.85 + 0.72*0.5 = 2.21
    assert advantages[0].tolist() == pytest.approx([2.21, 0.0, 0.5])


def test_whiten_uses_only_masked_entries():
    x = torch.tensor([[1.0, 3.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    assert whiten(x, mask)[0].tolist() == pytest.approx([-1.0, 1.0, 0.0], abs=1e-4)
    assert whiten(x, mask, shift_mean=False)[0].tolist() == pytest.approx([1.0, 3.0, 0.0], abs=1e-4)


def test_policy_loss_clips_pessimistically():
    ratios = torch.tensor([[1.1, 1.5, 0.5, 0.7, 3.0]])
    advantages = torch.tensor([[1.0, 1.0, 1.0, -1.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])  # the last token is padding
    old = torch.full_like(ratios, -2.0)
    loss, clipfrac = policy_loss(old + ratios.log(), old, advantages, mask, cliprange=0.2)
    # per token max(-A*r, -A*clip(r)): 1.1 inside -> -1.1; 1.5 clipped to 1.2 -> -1.2 (clip active);
    # 0.5 with A>0 stays -0.5 (the clip would be optimistic); 0.7 with A<0 -> 0.8 (clip active).
    assert loss.item() == pytest.approx((-1.1 - 1.2 - 0.5 + 0.8) / 4)
    assert clipfrac.item() == pytest.approx(0.5)


def test_value_loss_clips_around_old_values():
    values = torch.tensor([[0.1, 0.5, 0.5]])
    old_values = torch.tensor([[0.0, 0.0, 1.0]])
    returns = torch.tensor([[1.0, 1.0, 1.0]])
    loss, clipfrac = value_loss(values, old_values, returns, torch.ones(1, 3), cliprange_value=0.2)
    # errors: 0.81 (inside the clip); max(0.25, (0.2-1)^2=0.64) = 0.64 (clip active); max(0.25, (0.8-1)^2) = 0.25
    assert loss.item() == pytest.approx(0.5 * (0.81 + 0.64 + 0.25) / 3)
    assert clipfrac.item() == pytest.approx(1 / 3)


def test_adaptive_kl_controller():
    above = AdaptiveKLController(0.2, target=6.0, horizon=10000)
    above.update(current_kl=12.0, n_steps=100)  # error clipped to +0.2
    assert above.value == pytest.approx(0.2 * (1 + 0.2 * 100 / 10000))
    slightly = AdaptiveKLController(0.2, target=6.0, horizon=10000)
    slightly.update(current_kl=6.6, n_steps=100)  # error 0.1, inside the clip
    assert slightly.value == pytest.approx(0.2 * (1 + 0.1 * 100 / 10000))
    below = AdaptiveKLController(0.2, target=6.0, horizon=10000)
    below.update(current_kl=1.0, n_steps=100)
    assert below.value == pytest.approx(0.2 * (1 - 0.2 * 100 / 10000))
    fixed = AdaptiveKLController(0.2, target=None, horizon=10000)
    fixed.update(current_kl=50.0, n_steps=100)
    assert fixed.value == 0.2


def test_running_moments_match_the_whole_sample():
    moments = RunningMoments()
    first, second = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([10.0, -4.0])
    moments.update(first)
    moments.update(second)
    everything = torch.cat([first, second])
    assert moments.mean == pytest.approx(everything.mean().item())
    assert moments.std == pytest.approx(everything.std().item())


def test_completion_mask_keeps_the_first_stop_token():
    completions = torch.tensor([[5, 6, 2, 7, 2], [5, 6, 7, 8, 9], [3, 5, 0, 0, 0]])
    assert completion_mask(completions, stop_ids=[2, 3]).tolist() == [
        [1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
