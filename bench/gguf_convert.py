"""The one-time conversion of the embedded GGUF into a Hugging Face folder (`gym.models.loader.convert_gguf`):
transformers' reads as they are (the baseline: the file parsed for the tokenizer's config, the tokenizer and the
model, and the weight-name map built for every module) against Gym's, which parses once and builds the map once.

Each conversion runs in a fresh process into a fresh GYM_HOME, the two alternating for --rounds rounds; the
table gives each one's seconds (from the call to the written folder, imports excluded), the median ratio, and
whether the two folders hold the same bytes.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/gguf_convert.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CONVERT = """
import contextlib, sys, time
import gym.models.loader as loader
if sys.argv[1] == "transformers":
    loader.gguf_parsed_once = contextlib.nullcontext
started = time.perf_counter()
loader.resolve_model_path("smollm2-135m")
print(time.perf_counter() - started)
"""


def convert(way: str, home: Path) -> float:
    env = {**os.environ, "GYM_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", CONVERT, way], env=env, capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def same_bytes(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.iterdir())
    return names == sorted(p.name for p in b.iterdir()) and all(
        (a / name).read_bytes() == (b / name).read_bytes() for name in names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"transformers": [], "gym": []}
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.rounds):
            for way in times:
                times[way].append(convert(way, Path(scratch) / f"{way}-{round_}"))
        folders = [Path(scratch) / f"{way}-0" / "models" / "smollm2-135m" for way in times]
        identical = same_bytes(*folders)
    ratio = statistics.median(g / t for g, t in zip(times["gym"], times["transformers"]))
    print(f"Converting the embedded GGUF, {args.rounds} alternating rounds, each in a fresh process and GYM_HOME\n")
    print("| reads | seconds (median) | rounds |")
    print("|---|---:|---|")
    for way, label in (("transformers", "transformers' (baseline)"), ("gym", "parsed once (Gym)")):
        print(f"| {label} | {statistics.median(times[way]):.2f} | {', '.join(f'{t:.2f}' for t in times[way])} |")
    print(f"\nGym / baseline: {ratio:.2f}x (median of the rounds' ratios); the folders' bytes "
          f"{'are identical' if identical else 'DIFFER'}")


if __name__ == "__main__":
    main()
