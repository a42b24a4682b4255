"""What a guard costs `gym api`: added latency per request, and 16-stream throughput, with and without one.

The embedded model is served through the real HTTP path (uvicorn, the openai client) four ways, in one run:
  none         no guard (the baseline)
  keywords     `--guard keywords:FILE`, a 20-pattern list
  classifier   a sequence classifier the embedded model's size (SmolLM2-135M with a 2-label head): the cost of a
               guard trained by `gym train` stage cls on that base. Its head is untrained here, so its threshold
               is set out of reach (0.999): every check runs, no answer is cut, and every mode decodes the same
               tokens. What it flags is measured by the tests, not here.
  llama-guard  the same base prompted in Llama Guard 3's format (decodes up to 16 tokens per check): the cost of
               a chat guard of that size (a real Llama Guard 3 1B is ~9x larger).
Latency: one request at a time (--latency-requests of them), streamed, --tokens tokens each; mean wall time per
request. Throughput: 16 clients, --requests each, back to back; completion tokens (from usage) over wall time.
Answers are checked every --window tokens (the server's default 16), and the request itself once.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/guard_latency.py
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

QUESTIONS = ["Tell me about the sea.", "How do plants grow?", "Write a haiku about autumn.", "What is a prime number?",
             "Give me three tips for sleeping well.", "Why is the sky blue?", "Explain what a computer does.",
             "Describe a busy market."]
PATTERNS = ["bomb", "detonat", "nerve agent", "ricin", "\\bkill (him|her|them)\\b", "meth(amphetamine)? recipe",
            "credit card dump", "ransomware", "keylogger", "\\bslur\\b", "child abuse", "self-harm method",
            "untraceable (gun|weapon)", "3d[- ]printed gun", "launder money", "fake passport", "botnet",
            "phishing kit", "poison (him|her|them)", "suicide method"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(chat, policy) -> tuple[str, object, threading.Thread]:
    import uvicorn

    from gym.serve.app import create_app

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(chat, "smol", guard=policy), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    return f"http://127.0.0.1:{port}/v1", server, thread


def one(client, question: str, tokens: int, seed: int) -> int:
    stream = client.chat.completions.create(model="smol", messages=[{"role": "user", "content": question}],
                                            max_tokens=tokens, temperature=0.7, seed=seed, stream=True,
                                            stream_options={"include_usage": True})
    used = 0
    for chunk in stream:
        if chunk.usage is not None:
            used = chunk.usage.completion_tokens
    return used


def measure(url: str, args: argparse.Namespace) -> tuple[float, float]:
    """(mean seconds per lone request, tokens/s at 16 streams)."""
    import openai

    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)
    one(client, QUESTIONS[0], 4, 0)  # warm-up: first-call costs are nobody's latency
    lone = []
    for r in range(args.latency_requests):
        begin = time.perf_counter()
        one(client, QUESTIONS[r % len(QUESTIONS)], args.tokens, r)
        lone.append(time.perf_counter() - begin)
    produced = [0]
    lock = threading.Lock()

    def worker(c: int) -> None:
        own = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)
        for r in range(args.requests):
            used = one(own, QUESTIONS[(c + r) % len(QUESTIONS)], args.tokens, 1000 * c + r)
            with lock:
                produced[0] += used

    begin = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(c,)) for c in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return statistics.mean(lone), produced[0] / (time.perf_counter() - begin)


def guards(folder: Path, base: str) -> dict[str, object]:
    """The guard of each mode (None: no guard)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from gym.safety.guard import load_guard

    words = folder / "words.txt"
    words.write_text("\n".join(PATTERNS) + "\n")
    classifier = folder / "classifier"
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=2, id2label={0: "safe", 1: "unsafe"},
                                                               label2id={"safe": 0, "unsafe": 1})
    model.config.pad_token_id = model.config.eos_token_id
    model.save_pretrained(classifier)
    AutoTokenizer.from_pretrained(base).save_pretrained(classifier)
    return {"none": None, "keywords": load_guard(f"keywords:{words}"),
            "classifier": load_guard(str(classifier), threshold=0.999),
            "llama-guard": load_guard(f"llama-guard:{base}", threshold=0.999)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--requests", type=int, default=2, help="requests per client at 16 streams")
    parser.add_argument("--latency-requests", type=int, default=8)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--modes", default="none,keywords,classifier,llama-guard")
    args = parser.parse_args()

    from gym.infer.chat import ChatModel
    from gym.models.loader import resolve_model_path
    from gym.serve.guarding import GuardPolicy

    base = resolve_model_path(args.model)
    chat = ChatModel({"model_name_or_path": args.model}, max_batch_size=16, max_waiting=256)
    print(f"# {' '.join(['python'] + sys.argv)}")
    print(f"# served: {args.model} ({chat.model_args.infer_dtype}), {args.tokens} tokens per answer, window "
          f"{args.window}; guard models share the machine's cores with the server (torch threads "
          f"{torch.get_num_threads()})\n")
    print("| guard | lone request (s) | added per request (ms) | 16 streams (tok/s) | vs no guard |")
    print("|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        made = guards(Path(tmp), base)
        baseline: tuple[float, float] | None = None
        for mode in args.modes.split(","):
            guard = made[mode]
            policy = GuardPolicy(guard, window=args.window) if guard is not None else None  # type: ignore[arg-type]
            url, server, thread = start(chat, policy)
            lone, rate = measure(url, args)
            server.should_exit = True  # type: ignore[attr-defined]
            thread.join(30)
            if baseline is None:
                baseline = (lone, rate)
            added = (lone - baseline[0]) * 1000
            print(f"| {mode} | {lone:.2f} | {added:+.0f} | {rate:.1f} | {rate / baseline[1]:.2f}x |", flush=True)
    chat.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
