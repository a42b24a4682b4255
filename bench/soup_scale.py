"""DeltaSoup at scale: Multi-Krum over n contributions of d floats, through the real aggregate() path.

The contributions are views into one [n, d] float32 matrix, cut into tensors of --tensor floats each, so
gram_matrix stacks and multiplies them name by name exactly as it would a model's tensors. Timed:

- stacking: one pass of source.stacked(name) over all names (the memory traffic every pass pays);
- distance step: gram_matrix(source), i.e. stacking + the float32 products accumulated in float64;
- multi_krum: aggregate(source, "multi_krum") end to end (Gram pass, scores, combination pass).

Rates count flops as 2 per multiply-add. The symmetric product X X^T needs n^2 d of them if only one
triangle is computed (what BLAS syrk does), so the distance step's rate is n^2 d / seconds. The baseline,
measured in the same run with the same threads, is a plain float32 torch.mm of the Gram's block shape,
[n, GRAM_CHUNK] @ [GRAM_CHUNK, n] at 2 n^2 GRAM_CHUNK flops, and a square 2048^3 one. The issue's goals:
<= 8.5 s for multi_krum at n=1000, d=2^20, and the distance step at >= 60% of the matmul rate.

Each step is repeated (--repeats, interleaved with the baselines) and the best time kept. The machine's
load average is printed: timings taken next to other busy processes are not clean. Stacking a large
tensor page-faults fresh memory; PyTorch's THP_MEM_ALLOC_ENABLE=1 (transparent huge pages for large CPU
allocations) makes that about 5x cheaper, and the setting is printed too.

    [THP_MEM_ALLOC_ENABLE=1] python bench/soup_scale.py [--n 1000] [--d 1048576] [--tensor 65536] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from gym.soup import aggregators
from gym.soup.aggregators import aggregate, gram_matrix
from gym.soup.sources import InMemorySource


def best_of(runs: int, fn) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--d", type=int, default=2 ** 20)
    parser.add_argument("--tensor", type=int, default=65536, help="floats per tensor name (d is cut into these)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    n, d, size = args.n, args.d, min(args.tensor, args.d)
    thp = os.environ.get("THP_MEM_ALLOC_ENABLE")
    print(f"command: {'THP_MEM_ALLOC_ENABLE=' + thp + ' ' if thp else ''}python bench/soup_scale.py " +
          " ".join(sys.argv[1:]) +
          f"  (n={n}, d={d}, {d // size} tensors of {size}, threads={torch.get_num_threads()}, "
          f"GRAM_CHUNK={aggregators.GRAM_CHUNK}, GRAM_BLOCK={aggregators.GRAM_BLOCK}, "
          f"load average {os.getloadavg()[0]:.1f})\n")

    torch.manual_seed(args.seed)
    data = torch.randn(n, d)  # n * d * 4 bytes: 4 GiB at the defaults
    source = InMemorySource([{f"t{k:05d}": data[i, k * size:(k + 1) * size] for k in range(d // size)}
                             for i in range(n)])
    d = size * (d // size)
    warm = InMemorySource([{"w": data[i, :4096]} for i in range(n)])
    gram_matrix(warm)  # threads and allocator warm before anything is timed

    k = aggregators.GRAM_CHUNK
    a, b = torch.randn(n, k), torch.randn(k, n)
    sq1, sq2 = torch.randn(2048, 2048), torch.randn(2048, 2048)

    def one_pass() -> None:
        for name in source.names:
            source.stacked(name)

    # Interleaved repeats, best of each: the baseline sees the same machine state as the Gram.
    times: dict[str, float] = {}
    grams: list[torch.Tensor] = []
    results: list = []
    steps = {"mm": lambda: torch.mm(a, b), "square": lambda: torch.mm(sq1, sq2), "stacking": one_pass,
             "distance": lambda: grams.append(gram_matrix(source)),
             "multi_krum": lambda: results.append(aggregate(source, "multi_krum"))}
    for _ in range(args.repeats):
        for step, fn in steps.items():
            times[step] = min(times.get(step, float("inf")), best_of(3 if step in ("mm", "square") else 1, fn))
            grams[1:], results[1:] = [], []  # keep one of each, not one per repeat
    mm, square, stacking, distance, end_to_end = (times[s] for s in steps)
    mm_rate, square_rate = 2 * n * n * k / mm / 1e9, 2 * 2048 ** 3 / square / 1e9
    gram_rate = n * n * d / distance / 1e9
    reference = max(mm_rate, square_rate)

    exact = data[:64].double() @ data[:64].double().T  # float32 products vs float64, on 64 of them
    norm = exact.diagonal().sqrt()
    rel_error = float(((grams[0][:64, :64] - exact).abs() / (norm[:, None] * norm[None, :])).max())

    print("| step | seconds | GFLOP/s | share of matmul rate |")
    print("|---|---|---|---|")
    print(f"| baseline torch.mm [{n},{k}]x[{k},{n}] | {mm:.3f} | {mm_rate:.1f} | |")
    print(f"| baseline torch.mm 2048^3 | {square:.3f} | {square_rate:.1f} | |")
    print(f"| stacking pass ({d // size} names) | {stacking:.2f} | | |")
    print(f"| distance step (gram_matrix) | {distance:.2f} | {gram_rate:.1f} | {gram_rate / reference:.0%} |")
    print(f"| multi_krum end to end | {end_to_end:.2f} | | |")
    print(f"\nselected {len(results[0].selected)} of {n}; Gram vs float64 max relative error "
          f"{rel_error:.1e} (of |x_i||x_j|); goals: multi_krum <= 8.5 s -> "
          f"{'met' if end_to_end <= 8.5 else 'NOT met'}, distance step >= 60% of matmul -> "
          f"{'met' if gram_rate >= 0.6 * reference else 'NOT met'}; load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
