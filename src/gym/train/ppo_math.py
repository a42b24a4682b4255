"""PPO's maths as pure functions on [batch, completion_len] tensors; masks mark real completion tokens.

Kept apart from the method file (gym.train.methods.ppo) so that each piece can be checked against a
hand-computed example without a model.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True,
           total: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """(x - mean) / std over the masked entries; masked-out entries become 0. `total` sums a statistic over every
    process of a distributed run, so each whitens with the statistics of the whole global batch."""
    if total is None:
        mean = masked_mean(x, mask)
        var = masked_mean((x - mean) ** 2, mask)
    else:
        count = total(mask.sum().float()).clamp(min=1)
        mean = total((x * mask).sum()) / count
        var = total((((x - mean) ** 2) * mask).sum()) / count
    out = (x - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        out = out + mean
    return out * mask


def compute_gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
                lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al., 2016) -> (advantages, returns).

    Masked positions are skipped: they neither receive an advantage nor act as the next state, and
    the value after the last real token is 0 (the episode ends there).
    """
    mask = mask.to(values.dtype)
    advantages = torch.zeros_like(values)
    next_value = torch.zeros_like(values[:, 0])
    next_advantage = torch.zeros_like(values[:, 0])
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        m = mask[:, t]
        advantages[:, t] = advantage * m
        next_value = m * values[:, t] + (1 - m) * next_value
        next_advantage = m * advantage + (1 - m) * next_advantage
    returns = (advantages + values) * mask
    return advantages, returns


def policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, cliprange: float) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate, as a loss -> (loss, fraction of tokens where the clip was active)."""
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - cliprange, 1 + cliprange)
    loss = masked_mean(torch.maximum(unclipped, clipped), mask)
    clipfrac = masked_mean((clipped > unclipped).to(mask.dtype), mask)
    return loss, clipfrac.detach()


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               cliprange_value: float) -> tuple[torch.Tensor, torch.Tensor]:
    """0.5 x the larger of the plain and the clipped squared error -> (loss, clip fraction)."""
    clipped_values = old_values + torch.clamp(values - old_values, -cliprange_value, cliprange_value)
    unclipped_error = (values - returns) ** 2
    clipped_error = (clipped_values - returns) ** 2
    loss = 0.5 * masked_mean(torch.maximum(unclipped_error, clipped_error), mask)
    clipfrac = masked_mean((clipped_error > unclipped_error).to(mask.dtype), mask)
    return loss, clipfrac.detach()


class AdaptiveKLController:
    """Ziegler et al. (2019): move the KL coefficient so that the observed KL tracks `target`.

    With target None the coefficient stays fixed.
    """

    def __init__(self, init_kl_coef: float, target: float | None, horizon: int) -> None:
        self.value = init_kl_coef
        self.target = target
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        if self.target is None:
            return
        error = min(max(current_kl / self.target - 1, -0.2), 0.2)
        self.value *= 1 + error * n_steps / self.horizon


class RunningMoments:
    """Running mean and standard deviation of scores (Chan et al.'s parallel update)."""

    def __init__(self) -> None:
        self.mean, self.var, self.count = 0.0, 1.0, 1e-24

    def update(self, x: torch.Tensor) -> None:
        n = x.numel()
        batch_mean, batch_var = x.mean().item(), x.var(unbiased=False).item()
        delta, total = batch_mean - self.mean, self.count + n
        self.var = (self.var * self.count + batch_var * n + delta**2 * self.count * n / total) / total
        self.mean += delta * n / total
        self.count = total

    @property
    def std(self) -> float:
        return math.sqrt(self.var * self.count / max(self.count - 1, 1)) if self.count > 1 else 1.0


def completion_mask(completions: torch.Tensor, stop_ids: list[int]) -> torch.Tensor:
    """1 for every token up to and including the first stop token of each row, 0 after it."""
    is_stop = torch.isin(completions, torch.tensor(stop_ids, device=completions.device))
    stops_before = torch.cumsum(is_stop.long(), dim=1) - is_stop.long()
    return (stops_before == 0).float()
