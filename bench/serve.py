"""Serving throughput and time to first token on the embedded model, at concurrency 1, 4 and 16.

Three ways to answer the same requests, measured in the same run:
  generate      transformers' model.generate, one request after another (the baseline)
  one-at-a-time Gym's engine with max_batch_size=1 (requests queue; no shared forward passes)
  dynamic       Gym's engine with max_batch_size=16 (requests join the running batch each step)
Each of C clients sends --requests chat requests back to back; every answer is exactly --tokens
tokens (end-of-turn tokens are ignored) so all modes do the same work. TTFT is from submission to
the first token; tokens/s is all generated tokens over the wall time of the whole load.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/serve.py
"""

from __future__ import annotations

import argparse
import queue
import statistics
import sys
import threading
import time

import torch


def run_engine(model, tokenizer, prompts: list[list[int]], concurrency: int, per_client: int, tokens: int,
               batch: int, make_engine=None) -> tuple[float, list[float]]:
    """`make_engine(batch)`: the engine to load (default: HFEngine on `model`)."""
    from gym.infer.hf_engine import HFEngine
    from gym.infer.requests import Piece, SamplingParams

    if make_engine is not None:
        engine = make_engine(batch)
    else:
        engine = HFEngine(model, tokenizer, stop_token_ids=[], max_batch_size=batch, max_waiting=1024)
    ttfts: list[float] = []
    produced = [0]
    lock = threading.Lock()

    def client(c: int) -> None:
        for r in range(per_client):
            prompt = prompts[(c * per_client + r) % len(prompts)]
            start = time.perf_counter()
            request = engine.submit(prompt, SamplingParams(max_new_tokens=tokens, do_sample=True, temperature=0.7,
                                                           top_p=0.9, seed=c * 1000 + r))
            first = None
            for event in request.events():
                if first is None and isinstance(event, Piece):
                    first = time.perf_counter() - start
            with lock:
                ttfts.append(first or 0.0)
                produced[0] += len(request.generated)

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    engine.shutdown()
    return produced[0] / wall, ttfts


def run_generate(model, prompts: list[list[int]], concurrency: int, per_client: int, tokens: int
                 ) -> tuple[float, list[float]]:
    """The naive server: one worker thread answers a FIFO queue with model.generate, one request at a time."""
    from transformers.generation.streamers import BaseStreamer

    class FirstToken(BaseStreamer):
        def __init__(self) -> None:
            self.calls, self.at = 0, None

        def put(self, value) -> None:  # the first call carries the prompt, the second the first new token
            self.calls += 1
            if self.calls == 2:
                self.at = time.perf_counter()

        def end(self) -> None:
            pass

    jobs: queue.Queue = queue.Queue()

    def worker() -> None:
        while (job := jobs.get()) is not None:
            ids = torch.tensor([job["prompt"]])
            streamer = FirstToken()
            torch.manual_seed(job["seed"])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens,
                                 min_new_tokens=tokens, do_sample=True, temperature=0.7, top_p=0.9,
                                 pad_token_id=0, streamer=streamer)
            job.update(first=streamer.at, produced=out.shape[1] - ids.shape[1])
            job["done"].set()

    ttfts: list[float] = []
    produced = [0]
    lock = threading.Lock()

    def client(c: int) -> None:
        for r in range(per_client):
            job = {"prompt": prompts[(c * per_client + r) % len(prompts)], "seed": c * 1000 + r,
                   "done": threading.Event(), "submitted": time.perf_counter()}
            jobs.put(job)
            job["done"].wait()
            with lock:
                ttfts.append(job["first"] - job["submitted"])
                produced[0] += job["produced"]

    server = threading.Thread(target=worker)
    server.start()
    start = time.perf_counter()
    clients = [threading.Thread(target=client, args=(c,)) for c in range(concurrency)]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join()
    wall = time.perf_counter() - start
    jobs.put(None)
    server.join()
    return produced[0] / wall, ttfts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--requests", type=int, default=2, help="requests per client, back to back")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--skip-generate", action="store_true", help="leave out the model.generate baseline")
    args = parser.parse_args()

    from gym.infer.chat import ChatModel

    torch.manual_seed(0)
    chat = ChatModel({"model_name_or_path": args.model})
    questions = ["Tell me about the sea.", "How do plants grow?", "Write a haiku about autumn.",
                 "What is a prime number?", "Give me three tips for sleeping well.", "Why is the sky blue?",
                 "Explain what a computer does.", "Describe a busy market."]
    prompts = [chat.render([{"role": "user", "content": q}]) for q in questions]
    with torch.inference_mode():  # first-call costs (kernel selection, allocator) are nobody's TTFT
        chat.model.generate(torch.tensor([prompts[0]]), max_new_tokens=4, do_sample=False, pad_token_id=0)
    print(f"# {' '.join(['python'] + sys.argv)}")
    print(f"# model {args.model}, {args.tokens} tokens per answer, {args.requests} requests per client, "
          f"torch threads {torch.get_num_threads()}\n")
    print("| concurrency | mode | tokens/s | TTFT mean (s) | TTFT p95 (s) |")
    print("|---:|---|---:|---:|---:|")
    for concurrency in [int(c) for c in args.concurrency.split(",")]:
        modes = [("dynamic batching", 16), ("one at a time", 1)]
        rows = []
        for name, batch in modes:
            rate, ttfts = run_engine(chat.model, chat.tokenizer, prompts, concurrency, args.requests, args.tokens,
                                     batch)
            rows.append((name, rate, ttfts))
        if not args.skip_generate:
            rate, ttfts = run_generate(chat.model, prompts, concurrency, args.requests, args.tokens)
            rows.append(("model.generate, sequential", rate, ttfts))
        for name, rate, ttfts in rows:
            p95 = sorted(ttfts)[max(0, int(round(0.95 * len(ttfts))) - 1)]
            print(f"| {concurrency} | {name} | {rate:.1f} | {statistics.mean(ttfts):.2f} | {p95:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
