"""`gym train` with malloc keeping what a step frees (gym.core.allocator, the default) against glibc as it is.

Each round runs the same `gym train` twice, in fresh processes, once with GYM_KEEP_FREED_MEMORY=0 (malloc as glibc
sets it: large blocks mapped and unmapped at every step) and once without, the order alternating between rounds.
The table gives the run's training time (transformers' train_runtime: the steps, not the start), its minor page
faults and its system CPU, medians over rounds with their range.

    python bench/train_malloc.py [--config examples/quickstart.yaml] [--steps 24] [--rounds 3] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def one_run(config: str, steps: int, keep: bool, threads: int | None, folder: Path) -> dict[str, float]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GYM_KEEP_FREED_MEMORY": "1" if keep else "0"}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    out = folder / ("kept" if keep else "glibc")
    command = [sys.executable, "-m", "gym.cli", "train", config, f"max_steps={steps}", f"output_dir={out}",
               "save_strategy=no", "plot_loss=false", "report_to=none", "overwrite_output_dir=true"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"gym train failed:\n{done.stderr[-3000:]}")
    logged = [json.loads(line) for line in (out / "trainer_log.jsonl").read_text().splitlines() if line.strip()]
    runtime = next(row["train_runtime"] for row in reversed(logged) if "train_runtime" in row)
    return {"train_s": float(runtime), "faults": float(after.ru_minflt - before.ru_minflt),
            "system_s": after.ru_stime - before.ru_stime}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="examples/quickstart.yaml")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS for the runs (default: torch's)")
    args = parser.parse_args()

    flags = Path("/proc/cpuinfo").read_text(encoding="utf-8") if Path("/proc/cpuinfo").exists() else ""
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f" {f}" in flags]
    print(f"CPU flags: {' '.join(isa) or 'unknown'}; {os.cpu_count()} CPUs; threads: {args.threads or 'default'}; "
          f"{args.config}, {args.steps} steps, {args.rounds} rounds", flush=True)
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="gym-bench-malloc-") as folder:
        for round_ in range(args.rounds):
            for keep in ((False, True) if round_ % 2 == 0 else (True, False)):
                result = one_run(args.config, args.steps, keep, args.threads, Path(folder))
                runs[keep].append(result)
                print(f"  round {round_ + 1}, {'kept' if keep else 'glibc'}: {json.dumps(result)}", flush=True)

    def cell(keep: bool, key: str, fmt: str) -> str:
        values = [run[key] for run in runs[keep]]
        return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"

    print("\n| malloc | training s | minor page faults | system CPU s |\n|---|---:|---:|---:|")
    for keep, name in ((False, "glibc as it is (`GYM_KEEP_FREED_MEMORY=0`)"), (True, "freed memory kept (default)")):
        print(f"| {name} | {cell(keep, 'train_s', '.1f')} | {cell(keep, 'faults', ',.0f')} | "
              f"{cell(keep, 'system_s', '.1f')} |")
    ratio = statistics.median(r["train_s"] for r in runs[True]) / statistics.median(r["train_s"] for r in runs[False])
    print(f"\ntraining time, kept / glibc: {ratio:.2f}x")


if __name__ == "__main__":
    main()
