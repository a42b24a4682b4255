"""How long `gym train` takes to start: a one-step run in fresh processes, with accelerate's DeepSpeed probe as Gym
sets it (gym.core.deepspeed_probe: DeepSpeed imported only by a run that uses it) and as accelerate ships it
(DeepSpeed, where installed, imported to unwrap every model).

Both kinds of process import `accelerate.utils.other` first, the second then puts accelerate's own
`is_deepspeed_available` back; the order alternates between rounds. The table gives each kind's wall time and CPU
time (medians over rounds, with their range) and whether the process imported deepspeed.

    python bench/train_start.py [--config examples/quickstart.yaml] [--rounds 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

RUNNER = """
import atexit, sys
import gym
import accelerate.utils.other as unwrapping
if sys.argv[1] == "accelerate":
    unwrapping.is_deepspeed_available = unwrapping.is_deepspeed_available.__wrapped__
atexit.register(lambda: print("deepspeed imported:", "deepspeed" in sys.modules))
from gym.cli import main
sys.exit(main(sys.argv[2:]))
"""

KINDS = ("gym", "accelerate")


def one_run(config: str, kind: str, folder: Path) -> dict[str, float]:
    command = [sys.executable, "-c", RUNNER, kind, "train", config, "max_steps=1", f"output_dir={folder / kind}",
               "save_strategy=no", "plot_loss=false", "report_to=none", "overwrite_output_dir=true"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, env={**os.environ, "HF_HUB_OFFLINE": "1"}, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"gym train failed:\n{done.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "deepspeed": float("deepspeed imported: True" in done.stdout)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="examples/quickstart.yaml")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if importlib.util.find_spec("deepspeed") is None:
        sys.exit("deepspeed is not installed here: both kinds of process would be the same (pip install deepspeed)")

    flags = Path("/proc/cpuinfo").read_text(encoding="utf-8") if Path("/proc/cpuinfo").exists() else ""
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f" {f}" in flags]
    mlflow = importlib.util.find_spec("mlflow") is not None
    print(f"CPU flags: {' '.join(isa) or 'unknown'}; {os.cpu_count()} CPUs; mlflow installed: {mlflow}; "
          f"{args.config}, 1 step, {args.rounds} rounds", flush=True)
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
    with tempfile.TemporaryDirectory(prefix="gym-bench-start-") as folder:
        for round_ in range(args.rounds):
            for kind in (KINDS if round_ % 2 == 0 else KINDS[::-1]):
                result = one_run(args.config, kind, Path(folder))
                runs[kind].append(result)
                print(f"  round {round_ + 1}, {kind}: {result['wall_s']:.2f} s wall, {result['cpu_s']:.2f} s CPU",
                      flush=True)

    def cell(kind: str, key: str) -> str:
        values = [r[key] for r in runs[kind]]
        return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"

    base = statistics.median(r["wall_s"] for r in runs["accelerate"])
    print("\n| DeepSpeed probe | wall s | CPU s | deepspeed imported | wall / accelerate's |")
    print("|---|---:|---:|---|---:|")
    for kind in KINDS:
        imported = "yes" if all(r["deepspeed"] for r in runs[kind]) else "no" if not any(
            r["deepspeed"] for r in runs[kind]) else "some runs"
        wall = statistics.median(r["wall_s"] for r in runs[kind])
        print(f"| {kind} | {cell(kind, 'wall_s')} | {cell(kind, 'cpu_s')} | {imported} | {wall / base:.2f}x |")


if __name__ == "__main__":
    main()
