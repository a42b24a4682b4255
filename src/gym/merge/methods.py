"""The merge methods on one parameter: the base's tensor and each model's, in float32, to the merged tensor.

With deltas t_i = theta_i - base and weights w_i (formulas in docs/merge.md):

- linear (Wortsman et al., 2022, model soups): sum_i w_i theta_i, divided by sum_i w_i when normalize.
- task_arithmetic (Ilharco et al., 2023): base + lambda * sum_i w_i t_i (divided by sum_i w_i when normalize).
- ties (Yadav et al., 2023): trim each t_i to its floor(density * n) largest magnitudes; elect each entry's sign
  as the sign of sum_i w_i t_i (ties to +); keep the weighted entries whose sign is the elected one; sum them
  and, when normalize (the default), divide by the sum of the kept entries' weights: with equal weights that is
  the paper's disjoint mean.
- dare (Yu et al., 2024): drop each entry of t_i with probability 1 - density, divide the rest by density
  (rescale), then task arithmetic. dare_ties: the same drop, then ties' election and disjoint merge.

Where we follow mergekit rather than the papers: the sign is elected on the weighted deltas, normalize divides
by weights (not counts), and lambda scales the merged delta. peft's add_weighted_adapter elects on the
unweighted deltas and divides by counts, so the two differ when the weights are not all equal.

DARE's mask for model i and parameter NAME comes from a generator seeded with crc32("SEED:i:NAME"): the same
seed gives the same merge whatever order, subset or machine the parameters are merged on.
"""

from __future__ import annotations

import zlib

import torch

from gym.merge.config import MergeConfig, MergeMethod


def trim(delta: torch.Tensor, density: float) -> torch.Tensor:
    """delta with all but its floor(density * numel) largest magnitudes set to 0."""
    if density >= 1:
        return delta
    # The epsilon keeps a product such as 0.29 * 100 = 28.999... from losing an entry to float rounding.
    keep = int(density * delta.numel() + 1e-6)
    if keep == 0:
        return torch.zeros_like(delta)
    magnitude = delta.abs().reshape(-1)
    # A selection (kthvalue) is ~3x faster than topk on CPU for the large k TIES uses; entries equal to the
    # threshold (common in bf16 deltas) are kept by position until exactly `keep` survive.
    threshold = magnitude.kthvalue(magnitude.numel() - keep + 1).values
    mask = magnitude > threshold
    ties = (magnitude == threshold).nonzero().squeeze(1)
    mask[ties[: keep - int(mask.sum())]] = True
    return delta * mask.reshape(delta.shape)


def dare_generator(seed: int, index: int, name: str) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(f"{seed}:{index}:{name}".encode()))


def drop(delta: torch.Tensor, density: float, generator: torch.Generator, rescale: bool = True) -> torch.Tensor:
    """DARE: each entry kept with probability density, the kept ones divided by density when rescale."""
    if density >= 1:
        return delta
    kept = torch.rand(delta.shape, generator=generator) < density
    dropped = delta * kept
    return dropped / density if rescale else dropped


def elect_and_merge(weighted: torch.Tensor, weights: torch.Tensor, normalize: bool) -> torch.Tensor:
    """TIES' sign election and disjoint merge of stacked weighted deltas (model index first)."""
    elected = torch.where(weighted.sum(dim=0) >= 0, 1.0, -1.0)
    # sign() of a trimmed or dropped entry is 0, so it never counts as agreeing.
    agrees = weighted.sign() == elected
    merged = (weighted * agrees).sum(dim=0)
    if not normalize:
        return merged
    divisor = (weights * agrees).sum(dim=0)
    return merged / torch.where(divisor == 0, torch.ones_like(divisor), divisor)


def merge_parameter(config: MergeConfig, name: str, base: torch.Tensor | None,
                    tensors: list[torch.Tensor]) -> torch.Tensor:
    """The merged value of parameter `name`: `tensors` are the models' own values (float32, in config.models
    order), `base` the base's (None only for linear without a base model)."""
    method = config.merge_method
    stacked = torch.stack(tensors)
    weights = torch.tensor([m.weight for m in config.models], dtype=stacked.dtype)
    weights = weights.reshape(-1, *([1] * (stacked.dim() - 1)))
    total = float(weights.sum())
    if method is MergeMethod.LINEAR:
        merged = (weights * stacked).sum(dim=0)
        return merged / total if config.normalize else merged
    assert base is not None  # parse_merge_config requires base_model for every delta method
    deltas = list(stacked - base)
    if method.trims:
        deltas = [trim(d, m.density) for d, m in zip(deltas, config.models)]
    if method.drops:
        deltas = [drop(d, m.density, dare_generator(config.seed, i, name), config.rescale)
                  for i, (d, m) in enumerate(zip(deltas, config.models))]
    weighted = weights * torch.stack(deltas)
    if method.elects_sign:
        delta = elect_and_merge(weighted, weights, config.normalize)
    else:
        delta = weighted.sum(dim=0)
        if config.normalize and abs(total) > 1e-12:
            delta = delta / total
    return base + config.lambda_ * delta
