"""The kernels' thread pool (csrc/linear.cpp, SpinPool): the same results from the main thread, from an
engine-style background thread, from two threads at once (one gets the pool, the other runs alone), and
in a forked child (which has none of its parent's worker threads)."""

from __future__ import annotations

import multiprocessing
import threading

import pytest
import torch

from gym.infer.fast import kernels


@pytest.fixture(scope="module")
def packed():
    status = kernels.kernel_status()
    if status is not None:
        pytest.skip(f"the compiled gym kernels are not available here ({status})")
    weight = torch.randn(512, 256, generator=torch.Generator().manual_seed(0))
    return kernels.pack_int8(weight)


def _product(packed, seed: int) -> torch.Tensor:
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(seed))
    return kernels.linear_int8(x, *packed)


def test_background_and_concurrent_threads_compute_what_the_main_thread_does(packed):
    expected = [_product(packed, seed) for seed in range(40)]
    results: dict[tuple[int, int], bool] = {}

    def worker(tag: int) -> None:
        for _ in range(25):
            for seed in range(40):
                results[(tag, seed)] = results.get((tag, seed), True) and torch.equal(_product(packed, seed),
                                                                                   expected[seed])

    threads = [threading.Thread(target=worker, args=(tag,)) for tag in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads), "a kernel call hung"
    assert len(results) == 3 * 40 and all(results.values())


def _in_child(packed, queue) -> None:
    queue.put(_product(packed, 7).tolist())


def test_a_forked_child_runs_the_kernels(packed):
    parent = _product(packed, 7)  # the pool has workers in this process now
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_in_child, args=(packed, queue))
    child.start()
    got = queue.get(timeout=60)
    child.join(30)
    assert child.exitcode == 0
    assert torch.equal(torch.tensor(got), parent)
