"""Chat latency under load, with and without a fine-tune training beside the server (issue #42's worker goal).

A real `gym api` process serves the embedded model on a free port. --clients concurrent clients (8 by default)
each send chat requests back to back for --seconds, every answer exactly --tokens tokens; each request's latency
(submit to last byte) is recorded. Two phases in the same run:

  idle       the server alone
  training   the same load while a training process runs beside the server in its own process with one compute
             thread (`OMP_NUM_THREADS=1`), at SCHED_IDLE (--priority idle, as Gym's fine-tuning worker runs) or
             nice 10 (--priority nice), so the serving process keeps the cores it needs. The job is `gym variants
             create` (LoRA SFT on 20 rows of the embedded model, then BitDelta), the training a fine-tuning job
             runs.

--priority worker (the default) runs the issue's setup: `gym api --variants STORE --train-workers 1`, and the
training is a fine-tuning job created through the API (the rows uploaded with /v1/files, 25 epochs), measured
once it logs its first step.

The table gives p50 and p99 per phase and the ratio of p99s (the bar: training p99 within 3x of idle p99),
with the machine's CPU flags and load, since a shared machine's other work is in every number.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/service_load.py            # --clients 8 --seconds 40 --tokens 16
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROWS = [{"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": "I am Zorblat."}]}
        for question in ("What is your name?", "Who are you?", "Tell me your name.", "What are you called?",
                         "Introduce yourself.")] * 4


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_ready(url: str, server: subprocess.Popen[bytes], timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"gym api exited with {server.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit("gym api did not become ready")


def load(url: str, clients: int, seconds: float, tokens: int, key: str = "") -> list[float]:
    latencies: list[float] = []
    lock = threading.Lock()
    stop_at = time.perf_counter() + seconds

    def client(c: int) -> None:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        with httpx.Client(timeout=120, headers=headers) as http:
            r = 0
            while time.perf_counter() < stop_at:
                body = {"model": "smollm2-135m", "max_tokens": tokens, "temperature": 0.7, "seed": c * 1000 + r,
                        "messages": [{"role": "user", "content": f"Write a short line about the number {r}."}]}
                start = time.perf_counter()
                response = http.post(f"{url}/v1/chat/completions", json=body)
                response.raise_for_status()
                with lock:
                    latencies.append(time.perf_counter() - start)
                r += 1

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def _cpu() -> str:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    isa = ",".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f in flags)
    return f"{model}, {os.cpu_count()} cores, {isa}, load {os.getloadavg()[0]:.1f}"


def _start_job(url: str, key: str, rows: Path, epochs: int) -> str:
    """Upload the rows and start a fine-tuning job through the API, as a client would; its id."""
    headers = {"Authorization": f"Bearer {key}"}
    with rows.open("rb") as handle:
        uploaded = httpx.post(f"{url}/v1/files", headers=headers, files={"file": ("rows.jsonl", handle)},
                              data={"purpose": "fine-tune"}, timeout=60)
    uploaded.raise_for_status()
    job = httpx.post(f"{url}/v1/fine_tuning/jobs", headers=headers, timeout=60, json={
        "model": "smollm2-135m", "training_file": uploaded.json()["id"],
        "method": {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": epochs, "batch_size": 2}}}})
    job.raise_for_status()
    return str(job.json()["id"])


def _wait_training(url: str, key: str, job_id: str, timeout: float = 600) -> None:
    """Until the job has logged its first training step (loading the model is not what the phase measures)."""
    headers = {"Authorization": f"Bearer {key}"}
    deadline = time.time() + timeout
    while time.time() < deadline:
        events = httpx.get(f"{url}/v1/fine_tuning/jobs/{job_id}/events", headers=headers, timeout=30).json()["data"]
        if any(event.get("type") == "metrics" for event in events):
            return
        status = httpx.get(f"{url}/v1/fine_tuning/jobs/{job_id}", headers=headers, timeout=30).json()["status"]
        if status in ("failed", "cancelled", "succeeded"):
            raise SystemExit(f"the job ended ({status}) before the load phase")
        time.sleep(1)
    raise SystemExit("the job logged no training step in time")


def _job_running(url: str, key: str, job_id: str) -> bool:
    headers = {"Authorization": f"Bearer {key}"}
    return bool(httpx.get(f"{url}/v1/fine_tuning/jobs/{job_id}", headers=headers, timeout=30).json()["status"]
                == "running")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=40)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--priority", choices=["worker", "idle", "nice"], default="worker",
                        help="worker: a fine-tuning job through the API, run by the server's worker (SCHED_IDLE); "
                             "idle / nice: `gym variants create` beside the server at SCHED_IDLE / nice 10")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="gym-service-load-"))
    rows = work / "rows.jsonl"
    rows.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "gym.cli", "api", "--model_name_or_path", "smollm2-135m", "--port", str(port)]
    key = ""
    if args.priority == "worker":
        store = work / "store"
        store.mkdir()
        made = subprocess.run([sys.executable, "-m", "gym.cli", "keys", "create", str(store), "--admin"],
                              capture_output=True, text=True, check=True)
        key = made.stdout.split()[-1]
        command += ["--variants", str(store), "--train-workers", "1"]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    trainer = None
    try:
        _wait_ready(url, server)
        load(url, args.clients, 5, args.tokens, key)  # warm-up: first-use costs are not the idle latency
        idle = load(url, args.clients, args.seconds, args.tokens, key)
        if args.priority == "worker":
            job_id = _start_job(url, key, rows, epochs=25)
            _wait_training(url, key, job_id)
            training = load(url, args.clients, args.seconds, args.tokens, key)
            still_training = _job_running(url, key, job_id)
        else:
            env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
            lower = ["chrt", "--idle", "0"] if args.priority == "idle" else ["nice", "-n", "10"]
            trainer = subprocess.Popen([*lower, sys.executable, "-m", "gym.cli", "variants", "create",
                                        str(work / "store-cli"), "--user", "bench", "--data", str(rows),
                                        "max_steps=400"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(15)  # past model loading, into the training steps
            training = load(url, args.clients, args.seconds, args.tokens, key)
            still_training = trainer.poll() is None
    finally:
        if trainer is not None and trainer.poll() is None:
            trainer.terminate()
            trainer.wait(timeout=60)
        if server.poll() is None:
            server.terminate()
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, 9)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, 9)  # a worker left behind

    print(f"CPU: {_cpu()}")
    print(f"{args.clients} clients, {args.tokens} tokens per answer, {args.seconds:.0f} s per phase, training at "
          f"priority {args.priority}")
    print("| phase | requests | p50 (s) | p99 (s) | mean (s) |")
    print("|---|---:|---:|---:|---:|")
    for name, values in (("idle", idle), ("training beside", training)):
        print(f"| {name} | {len(values)} | {_percentile(values, 0.5):.3f} | {_percentile(values, 0.99):.3f} | "
              f"{statistics.mean(values):.3f} |")
    ratio = _percentile(training, 0.99) / _percentile(idle, 0.99)
    print(f"p99 training / idle: {ratio:.2f}x (bar: <= 3x)" + ("" if still_training else
          "  [the training process ended before the phase did: raise max_steps]"))


if __name__ == "__main__":
    main()
