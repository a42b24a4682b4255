"""The collective helpers Gym's own PPO loop uses under torchrun, on 2 real CPU processes over gloo: sums, gathers,
means, a stop decision taken together, gradient averaging (what DDP does), and the end-of-run check that catches
processes whose weights drifted apart."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gym.core.errors import GymError
from gym.train import ranks
from gym.train.ppo_math import whiten
from gym.workflows.launch import free_port


def _worker(rank: int, port: int, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        seen: dict = {}
        seen["sum"] = ranks.sum_across(torch.tensor([1.0 + rank])).tolist()
        seen["gather"] = ranks.gather_across(torch.tensor([10.0 * rank, 10.0 * rank + 1])).tolist()
        seen["mean"] = ranks.mean_across({"loss": 1.0 + 2 * rank, "kl": float(rank)})
        seen["stop"] = ranks.any_across(rank == 1)
        x, mask = torch.tensor([[1.0, 2.0]]) + 2 * rank, torch.ones(1, 2)
        seen["whiten"] = whiten(x, mask, total=ranks.sum_across).tolist()
        param = torch.nn.Parameter(torch.zeros(3))
        param.grad = torch.full((3,), 2.0 * rank)  # rank 0: 0, rank 1: 2 -> mean 1
        ranks.average_gradients([param])
        seen["grad"] = param.grad.tolist()
        ranks.check_in_step([param])  # equal weights: passes
        drifted = torch.nn.Parameter(torch.full((3,), float(rank)))
        try:
            ranks.check_in_step([drifted])
            seen["drift"] = None
        except GymError as error:
            seen["drift"] = str(error)
        Path(out, f"{rank}.json").write_text(json.dumps(seen))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_collectives_on_two_cpu_processes(tmp_path):
    mp.spawn(_worker, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    seen = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in (0, 1)]
    # the global batch [1, 2, 3, 4] whitened as one: what a single process would compute on all of it
    reference = whiten(torch.tensor([[1.0, 2.0, 3.0, 4.0]]), torch.ones(1, 4)).tolist()[0]
    for rank, got in enumerate(seen):
        assert got["sum"] == [3.0] and got["gather"] == [0.0, 1.0, 10.0, 11.0]
        assert got["mean"] == {"kl": 0.5, "loss": 2.0} and got["stop"] is True
        assert got["whiten"][0] == pytest.approx(reference[2 * rank: 2 * rank + 2], abs=1e-6)
        assert got["grad"] == [1.0, 1.0, 1.0]
        assert "ended with different weights" in got["drift"]


def test_one_process_needs_no_group():
    assert ranks.sum_across(torch.tensor([2.0])).tolist() == [2.0]
    assert ranks.mean_across({"a": 1.0}) == {"a": 1.0} and ranks.any_across(False) is False
