"""Cold start of `gym chat --prompt` on the embedded model: wall time from launching the real command in a fresh
process to its first answer token, and to its exit, in five modes taking turns in one run (issue #43).

  transformers  the cache present, but the model and tokenizer loaded through transformers' auto classes
                (GYM_DIRECT_LOAD=0 GYM_TOKENIZER_MEMO=0): how every warm start went before the fast engine read
                the model's files itself (the baseline of `warm`)
  warm, transformers' tokenizer  the same with the tokenizer loaded through transformers (GYM_QUICK_TOKENIZER=0):
                how every warm start went before gym.models.quick_tokenizer (the baseline of `warm`'s last change)
  warm          the cache present: what every later start costs
  cold          the packed-weight cache removed first: the first start after install and the model's one-time
                GGUF conversion (packs the weights, writes the cache; the conversion remembered the tokenizer's
                class)
  cold, new folder  the remembered tokenizer class removed too: the first start on a model folder that came
                without a conversion (a local or downloaded Hugging Face folder), where the folder's tokenizer
                is one transformers must load (the embedded one's is not: QuickTokenizer reads it)
  no cache      GYM_PACK_CACHE=0: the weights packed at every start

The compiled kernels and the converted model are in $GYM_HOME already (run the command once before), so neither
the one-time kernel build nor the GGUF conversion is counted. `engine ready` is what the fast engine reports
("Fast engine ready in X s"): building its decoder, the packing or the cache read included. The table's
caption also gives `python -c "import torch"` alone, timed in the same repetitions: no start can go below it.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/cold_start.py [--repeats 3] [--max-new-tokens 8]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

MODES = ("transformers", "warm, transformers' tokenizer", "warm", "cold", "cold, new folder", "no cache")
SETTINGS = {"transformers": {"GYM_DIRECT_LOAD": "0", "GYM_TOKENIZER_MEMO": "0"},
            "warm, transformers' tokenizer": {"GYM_QUICK_TOKENIZER": "0"}, "no cache": {"GYM_PACK_CACHE": "0"}}
READY = re.compile(r"Fast engine ready in ([0-9.]+)s")
ANSWER = b"Assistant: "


@dataclass
class Run:
    first_token: float  # seconds from launch to the first byte of the answer
    total: float  # seconds from launch to exit
    engine_ready: float  # what the engine reports


def gym_command() -> list[str]:
    """The installed `gym` script beside this interpreter (what a user types), else the module."""
    script = Path(sys.executable).parent / "gym"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "gym.cli"]


def run_once(args: list[str], env: dict[str, str]) -> Run:
    started = time.perf_counter()
    process = subprocess.Popen(gym_command() + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert process.stdout is not None and process.stderr is not None
    errors: list[bytes] = []
    drain = threading.Thread(target=lambda: errors.append(process.stderr.read() if process.stderr else b""))
    drain.start()
    output, first_token = b"", None
    while chunk := os.read(process.stdout.fileno(), 4096):
        output += chunk
        if first_token is None and ANSWER in output and len(output) > output.index(ANSWER) + len(ANSWER):
            first_token = time.perf_counter() - started
    code = process.wait()
    total = time.perf_counter() - started
    drain.join()
    stderr = b"".join(errors).decode(errors="replace")
    if code != 0 or first_token is None:
        raise SystemExit(f"gym chat failed (exit {code}):\n{stderr[-3000:]}")
    ready = READY.search(stderr)
    return Run(first_token, total, float(ready.group(1)) if ready else float("nan"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompt", default="Say hi.")
    parser.add_argument("--max-new-tokens", type=int, default=8)
    options = parser.parse_args()

    from gym.infer.fast.pack_cache import cache_folders
    from gym.models.loader import resolve_model_path
    from gym.models.tokenizer_class import memo_file

    model_dir = Path(resolve_model_path(options.model))  # converts the GGUF once, before anything is timed
    args = ["chat", "--model_name_or_path", options.model, "--prompt", options.prompt,
            "--max_new_tokens", str(options.max_new_tokens)]
    base_env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    # builds the kernels if this machine has not yet, and leaves a warm cache; and, allowed to write bytecode,
    # leaves every imported module's compiled form as installing the package does (a checkout under
    # PYTHONDONTWRITEBYTECODE=1 would otherwise compile Gym's modules from source at every start)
    run_once(args, {key: value for key, value in base_env.items() if key != "PYTHONDONTWRITEBYTECODE"})
    torch_alone = []
    runs: dict[str, list[Run]] = {mode: [] for mode in MODES}
    for repeat in range(options.repeats):
        for mode in MODES:
            env = {**base_env, **SETTINGS.get(mode, {})}
            if mode.startswith("cold"):
                for folder in cache_folders(model_dir):
                    shutil.rmtree(folder, ignore_errors=True)
            if mode == "cold, new folder":
                memo_file(model_dir).unlink(missing_ok=True)
            run = run_once(args, env)
            runs[mode].append(run)
            print(f"  repeat {repeat + 1} {mode:>29}: first token {run.first_token:6.2f} s, total {run.total:6.2f} s, "
                  f"engine ready {run.engine_ready:5.2f} s", file=sys.stderr)
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=True, env=base_env)
        torch_alone.append(time.perf_counter() - started)

    print(f"`gym chat --model_name_or_path {options.model} --prompt {options.prompt!r} --max_new_tokens "
          f"{options.max_new_tokens}`, {options.repeats} runs per mode, medians (s); load average "
          f"{os.getloadavg()[0]:.2f} at the end; `python -c 'import torch'` alone, the floor of any start that "
          f"loads torch: {statistics.median(torch_alone):.2f} s\n")
    print("| mode | first token | total | engine ready | first token against `transformers` |")
    print("|---|---:|---:|---:|---:|")
    baseline = statistics.median(r.first_token for r in runs["transformers"])
    for mode in MODES:
        first = statistics.median(r.first_token for r in runs[mode])
        total = statistics.median(r.total for r in runs[mode])
        ready = statistics.median(r.engine_ready for r in runs[mode])
        print(f"| {mode} | {first:.2f} | {total:.2f} | {ready:.2f} | {baseline / first:.2f}x faster |")


if __name__ == "__main__":
    main()
