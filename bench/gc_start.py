"""A command's start with Python's full collections held back (`gym.core.heap`, what `gym` does) against
CPython's own rule (the baseline: a full collection each time the long-lived objects grow by a quarter, ten of
them while torch, transformers and the rest import).

Two commands, each run whole in a fresh process, wall time from launch to exit, the two ways alternating for
--rounds rounds: `gym chat --model_name_or_path smollm2-135m --prompt 'Say hi.' --max_new_tokens 8` and one step
of `gym train examples/quickstart.yaml` (the start, one step of the embedded model, the save).

    HF_HUB_OFFLINE=1 .venv/bin/python bench/gc_start.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUN = """
import contextlib, sys
import gym.cli
if sys.argv[1] == "cpython":
    gym.cli.deferred_full_collections = contextlib.nullcontext
sys.exit(gym.cli.main(sys.argv[2:]))
"""


def commands(out: Path) -> dict[str, list[str]]:
    return {
        "gym chat --prompt": ["chat", "--model_name_or_path", "smollm2-135m", "--prompt", "Say hi.",
                              "--max_new_tokens", "8"],
        "gym train, 1 step": ["train", str(REPO / "examples" / "quickstart.yaml"), "max_steps=1",
                              f"output_dir={out}", "save_steps=1000", "plot_loss=false", "disable_tqdm=true"],
    }


def seconds(way: str, argv: list[str]) -> float:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", RUN, way, *argv], env=env, cwd=REPO, capture_output=True, check=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    rounds = parser.parse_args().rounds
    with tempfile.TemporaryDirectory() as tmp:
        runs = commands(Path(tmp) / "run")
        times: dict[tuple[str, str], list[float]] = {}
        for name, argv in runs.items():
            seconds("held back", argv)  # the page cache and the pack cache warm, as on any second start
            for _ in range(rounds):
                for way in ("cpython", "held back"):
                    times.setdefault((name, way), []).append(seconds(way, argv))
    print(f"{rounds} rounds, the two ways alternating, medians (s), launch to exit; load average "
          f"{os.getloadavg()[0]:.2f} at the end\n")
    print("| command | CPython's rule (baseline) | held back (Gym) | Gym / baseline |")
    print("|---|---:|---:|---:|")
    for name in runs:
        base = statistics.median(times[(name, "cpython")])
        held = statistics.median(times[(name, "held back")])
        print(f"| {name} | {base:.2f} | {held:.2f} | {held / base:.2f}x |")


if __name__ == "__main__":
    main()
