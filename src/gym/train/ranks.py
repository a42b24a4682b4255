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
    return int(os.environ.get("RANK", "0")) == 0


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
