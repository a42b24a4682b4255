"""Time to choose the next token from a 49,152-token vocabulary (the embedded model's), per step: Gym's
sampler (gym.infer.sampling) against its own batched-topk way (the baseline: what every top-p row went
through before the candidate shortcut), in one run, on the calling thread and on a second thread (an
engine runs its steps on a thread of its own, where torch's parallel ops pay for waking their workers).
Gym's sampler is timed twice: in torch and numpy (where the fast engine's kernels are not loaded), and on
the kernels (csrc/sampling.cpp: the softmax and the nucleus picks on their threads), when they load here.

    .venv/bin/python bench/sampling_speed.py

Rows are a trained model's kind of distribution (a few dozen likely tokens), sampled as the API
samples by default here (temperature 0.7, top_p 0.9), or greedy.
"""

from __future__ import annotations

import statistics
import threading
import time
from contextlib import contextmanager

import torch

from gym.infer import sampling
from gym.infer.fast import kernels
from gym.infer.requests import Request, SamplingParams

VOCAB = 49152


@contextmanager
def baseline():
    """Every top-p row through the batched topk, every argmax through torch."""
    saved = sampling.MAX_CANDIDATES, sampling._argmax
    sampling.MAX_CANDIDATES = -1
    sampling._argmax = lambda logits: logits.argmax(-1).tolist()
    try:
        yield
    finally:
        sampling.MAX_CANDIDATES, sampling._argmax = saved


def step_us(rows: int, greedy: bool, repeats: int = 300) -> float:
    torch.manual_seed(rows)
    logits = torch.randn(rows, VOCAB) * 2.5
    logits[:, :24] += 12  # a peaked distribution, as a trained model's
    params = SamplingParams(do_sample=not greedy, temperature=0.7, top_p=0.9, top_k=0, seed=1)
    requests = [Request([1], params, sink=lambda event: None) for _ in range(rows)]
    times = []
    for _ in range(repeats):
        scratch = logits.clone()
        start = time.perf_counter()
        sampling.sample_rows(requests, scratch)
        times.append(time.perf_counter() - start)
    return 1e6 * statistics.median(times)


@contextmanager
def without_kernels():
    """Gym's sampler as it runs where the kernels are not loaded."""
    saved = kernels._state.get("ok")
    kernels._state["ok"] = False
    try:
        yield
    finally:
        kernels._state["ok"] = saved


def measure(on_thread: bool, rows: int, greedy: bool, compiled: bool) -> list[float]:
    """µs per step: the baseline, Gym's sampler without the kernels, and with them (when `compiled`)."""
    result: list[float] = []

    def run() -> None:
        with baseline(), without_kernels():
            result.append(step_us(rows, greedy))
        with without_kernels():
            result.append(step_us(rows, greedy))
        if compiled:
            result.append(step_us(rows, greedy))

    if on_thread:
        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
    else:
        run()
    return result


def main() -> None:
    status = kernels.kernel_status()
    compiled = status is None
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; median µs per step over 300 steps; "
          + (f"kernels: {kernels.kernel_isa()}" if compiled else f"no kernels ({status})"))
    print(f"{'thread':<8} {'rows':>4} {'sampling':<9} {'baseline µs':>12} {'gym µs':>8} {'speed-up':>9}"
          + (f" {'kernels µs':>11} {'vs gym':>7}" if compiled else ""))
    for on_thread in (False, True):
        for rows in (1, 16):
            for greedy in (False, True):
                times = measure(on_thread, rows, greedy, compiled)
                before, after = times[0], times[1]
                line = (f"{'engine' if on_thread else 'main':<8} {rows:>4} {'greedy' if greedy else 'top-p':<9} "
                        f"{before:>12.0f} {after:>8.0f} {before / after:>8.1f}x")
                if compiled:
                    line += f" {times[2]:>11.0f} {after / times[2]:>6.1f}x"
                print(line, flush=True)


if __name__ == "__main__":
    main()
