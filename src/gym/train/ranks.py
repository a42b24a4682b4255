"""Which process of a distributed run this is, read from torchrun's environment (no process group needed), and a
barrier that is a no-op when there is only one process. The run's own files (the lock, the log, the final save,
evaluation, delta compression) belong to global rank 0; the others train and wait."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process() -> bool:
    return rank() == 0


def wait_for_everyone() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


@contextmanager
def local_main_first(training_args: Any) -> Iterator[None]:
    """On each machine, its first process goes first (converting the embedded model, downloading, tokenizing);
    the others wait, then find those files already there."""
    if world_size() <= 1:
        yield
        return
    with training_args.main_process_first(local=True, desc="preparing the model files and data"):
        yield


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _group_active() -> bool:
    import torch.distributed as dist

    return world_size() > 1 and dist.is_available() and dist.is_initialized()


def sum_across(tensor: Any) -> Any:
    """The tensor summed over every process (itself when there is one)."""
    if not _group_active():
        return tensor
    import torch
    import torch.distributed as dist

    total = tensor.detach().clone()
    if dist.get_backend() == "nccl" and total.device.type == "cpu":  # NCCL reduces only tensors on the GPU
        on_gpu = total.to(torch.device("cuda", torch.cuda.current_device()))
        dist.all_reduce(on_gpu)
        return on_gpu.to(tensor.device)
    dist.all_reduce(total)
    return total


def gather_across(tensor: Any) -> Any:
    """Every process's 1-D tensor (all of one length), concatenated in rank order."""
    if not _group_active():
        return tensor
    import torch
    import torch.distributed as dist

    parts = [torch.empty_like(tensor) for _ in range(world_size())]
    dist.all_gather(parts, tensor.detach().contiguous())
    return torch.cat(parts)


def mean_across(values: dict[str, float]) -> dict[str, float]:
    """Each number averaged over the processes (all must hold the same keys)."""
    if not _group_active():
        return values
    import torch

    keys = sorted(values)
    means = sum_across(torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)) / world_size()
    return dict(zip(keys, means.tolist(), strict=True))


def any_across(flag: bool) -> bool:
    """True on every process when it is true on one: a decision (e.g. to stop) that all must take together."""
    if not _group_active():
        return flag
    import torch

    return bool(sum_across(torch.tensor([int(flag)])).item() > 0)


def average_gradients(params: list[Any]) -> None:
    """What DDP does between backward and step: each gradient replaced by its mean over the processes."""
    if not _group_active():
        return
    import torch

    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = sum_across(torch.cat([g.reshape(-1) for g in grads])) / world_size()
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
        offset += grad.numel()


def check_in_step(params: list[Any]) -> None:
    """Every process must end with the same weights; a difference means the run was not one run."""
    if not _group_active():
        return
    import torch

    from gym.core.errors import GymError

    checksum = torch.stack([p.detach().double().sum() for p in params]).sum().reshape(1)
    sums = gather_across(checksum)
    if not torch.allclose(sums, sums[0].expand_as(sums), rtol=1e-6, atol=1e-6):
        raise GymError(f"The processes ended with different weights (checksums {sums.tolist()}): the run's "
                       "gradients were not averaged across them.")
