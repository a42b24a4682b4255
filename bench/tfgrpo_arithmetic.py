"""Training-Free GRPO end to end through `gym api`: the embedded model serves, `gym tfgrpo` trains and evaluates.

Starts `gym api` on the embedded model (a subprocess, 127.0.0.1), then runs, as a user would:
    gym tfgrpo train examples/tfgrpo_arithmetic.yaml base_url=<server> model=<served name> ...
    gym tfgrpo eval  examples/tfgrpo_arithmetic.yaml base_url=<server> ...
and prints Mean@k / Pass@k on the held-out queries without the library (the baseline, measured in the same
run) and with it, the library, and the calls and tokens per role.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/tfgrpo_arithmetic.py [--epochs 1] [--k 4] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GYM = [sys.executable, "-m", "gym.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(url: str, server: subprocess.Popen[bytes], seconds: float = 300) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"gym api exited with status {server.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit("gym api did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--k", type=int, default=4, help="samples per held-out query (Mean@k)")
    parser.add_argument("--infer_dtype", default="int8")
    parser.add_argument("overrides", nargs="*", help="more key=value for gym tfgrpo")
    args = parser.parse_args()
    port = free_port()
    out = Path(tempfile.mkdtemp(prefix="tfgrpo-bench-"))
    server = subprocess.Popen([*GYM, "api", "--model_name_or_path", "smollm2-135m", "--infer_dtype", args.infer_dtype,
                               "--port", str(port), "--max_batch_size", "16", "--served_model_name", "smollm2"],
                              cwd=REPO)
    try:
        wait_for(f"http://127.0.0.1:{port}/health", server)
        common = [str(REPO / "examples" / "tfgrpo_arithmetic.yaml"), f"base_url=http://127.0.0.1:{port}/v1",
                  "model=smollm2", f"max_epochs={args.epochs}", f"eval_samples={args.k}", f"output_dir={out}",
                  f"dataset_dir={REPO / 'data'}", *args.overrides]
        started = time.perf_counter()
        subprocess.run([*GYM, "tfgrpo", "train", *common], check=True, cwd=REPO)
        trained = time.perf_counter() - started
        subprocess.run([*GYM, "tfgrpo", "eval", *common], check=True, cwd=REPO)
    finally:
        server.terminate()
        server.wait(60)
    results = json.loads((out / "eval_results.json").read_text())
    usage = json.loads((out / "usage.json").read_text())
    state = json.loads((out / "tfgrpo_state.json").read_text())
    library = json.loads((out / "experiences.json").read_text())
    print(f"\n## Training-Free GRPO through gym api (embedded model, {args.infer_dtype}), run folder {out}")
    queries = state["queries"].split(":")[0]
    print(f"train: {queries} queries, {args.epochs} epoch(s), {len(state['history'])} steps, {trained:.0f} s")
    print(f"\n| | Mean@{args.k} | Pass@{args.k} |\n|---|---|---|")
    for name in ("baseline", "with experiences"):
        if name in results:
            r = results[name]
            print(f"| {name} ({r['queries']} held-out queries) | {r['mean_at_k']:.3f} | {r['pass_at_k']:.3f} |")
    print("\n| step | reward | groups with an advantage | update calls | ADD/UPDATE/DELETE | library |\n"
          "|---|---|---|---|---|---|")
    for h in state["history"]:
        ops = h["operations"]
        print(f"| {h['step']} | {h['mean_reward']:.3f} | {h['partial_groups']}/{h['queries']} | {h['update_calls']} | "
              f"{ops['ADD']}/{ops['UPDATE']}/{ops['DELETE']} | {h['size']} |")
    print("\n| role (training) | calls | prompt tokens | completion tokens |\n|---|---|---|---|")
    for role, u in usage["roles"].items():
        print(f"| {role} | {u['calls']} | {u['prompt_tokens']} | {u['completion_tokens']} |")
    print("\nLibrary:")
    for i, text in library["experiences"].items():
        print(f"[{i}]. {text}")


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
