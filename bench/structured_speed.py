"""Decode speed with and without a JSON-schema constraint (gym.infer.grammar), in the same run, on the
embedded model: the fast engine at 1 and --streams concurrent streams, and the transformers engine at one
stream (--no-hf to skip it). The issue's bar: the per-token mask must not more than halve decode speed.

Every answer is exactly --tokens tokens: the engine has no end-of-turn token and the schema (an array of
at least 50 objects with a string, a bounded integer, an enum and an array of strings) cannot be finished
sooner, so both sides do the same number of steps. Constrained answers spend their tokens on keys, enum
values, numbers and free strings alike. tok/s counts every answer's tokens over the wall time from the
first submit to the last token (the 16-token prompts' prefill included, the same on both sides). Plain
and constrained runs alternate for --rounds rounds and the medians are compared, so a load that comes
and goes on a shared machine hits both sides alike. `grammar µs/token` is the time inside the matcher
(mask + advance) per constrained token, measured in the same runs.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 .venv/bin/python bench/structured_speed.py
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import threading
import time
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["name", "age", "color", "tags"],
    "additionalProperties": False,
}
SCHEMA = {"type": "array", "items": PERSON, "minItems": 50}
PROMPT = "A list of people as JSON, with their names, ages, favourite colours and tags:"


def cpu_summary() -> str:
    """The CPU as lscpu would name it, its cores, the vector extensions the kernels care about, and the load
    (a shared machine's other work is in every number)."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")),
                 platform.processor() or "unknown CPU")
    flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), []))
    wanted = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8") if f in flags]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{model}, {os.cpu_count()} cores, flags {' '.join(wanted) or '-'}; load average {load:.1f}; "
            f"torch {torch.__version__}, {torch.get_num_threads()} threads")


class GrammarClock:
    """Time spent in Matcher.mask and Matcher.advance, per constrained token."""

    def __init__(self) -> None:
        from gym.infer import grammar

        self.seconds, self.tokens, self._lock = 0.0, 0, threading.Lock()
        for name in ("mask", "advance"):
            original = getattr(grammar.Matcher, name)

            def timed(matcher, *args, _original=original, _name=name):
                start = time.perf_counter()
                try:
                    return _original(matcher, *args)
                finally:
                    with self._lock:
                        self.seconds += time.perf_counter() - start
                        self.tokens += _name == "advance"

            setattr(grammar.Matcher, name, timed)

    def take(self) -> float:
        """µs per constrained token since the last take."""
        with self._lock:
            per_token = 1e6 * self.seconds / max(self.tokens, 1)
            self.seconds, self.tokens = 0.0, 0
        return per_token


def run(engine, prompt: list[int], streams: int, tokens: int, constraint) -> float:
    """Aggregate tok/s of `streams` answers of exactly `tokens` tokens, all submitted at once."""
    from gym.infer.requests import SamplingParams

    start = time.perf_counter()
    requests = [engine.submit(prompt, SamplingParams(max_new_tokens=tokens, do_sample=True, temperature=0.7,
                                                     top_p=1.0, top_k=0, seed=seed, constraint=constraint))
                for seed in range(streams)]
    done = [list(request.events())[-1] for request in requests]
    seconds = time.perf_counter() - start
    assert all(d.reason == "length" and d.completion_tokens == tokens for d in done), done
    return streams * tokens / seconds


def measure(engine, prompt, streams, tokens, rounds, constraint, clock) -> tuple[float, float, float]:
    """(median plain tok/s, median constrained tok/s, grammar µs per constrained token), alternating."""
    run(engine, prompt, streams, 4, None)  # warm-up: first-step allocations, and the grammar's tokenizer
    run(engine, prompt, streams, 4, constraint)
    clock.take()
    plain, constrained = [], []
    for _ in range(rounds):
        plain.append(run(engine, prompt, streams, tokens, None))
        constrained.append(run(engine, prompt, streams, tokens, constraint))
    return statistics.median(plain), statistics.median(constrained), clock.take()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--streams", type=int, default=4, help="the concurrent-streams row (besides 1)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", default="float32", help="the fast engine's weights")
    parser.add_argument("--no-hf", action="store_true", help="skip the transformers engine row")
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM

    from gym.infer import grammar
    from gym.infer.fast.engine import FastEngine
    from gym.infer.hf_engine import HFEngine
    from gym.models.loader import load_tokenizer, resolve_model_path

    path = resolve_model_path("smollm2-135m")
    tokenizer = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompt = tokenizer.encode(PROMPT)[:16]
    constraint = grammar.json_schema(SCHEMA)
    clock = GrammarClock()
    print(cpu_summary())
    print(f"{args.tokens} tokens per answer, {args.rounds} alternating rounds (medians); schema: an array of "
          f">= 50 objects (string, integer, enum, array of strings)")
    print(f"{'engine':<10} {'weights':<9} {'streams':>7} {'plain tok/s':>12} {'json_schema tok/s':>18} "
          f"{'ratio':>6} {'grammar µs/token':>17}")
    rows: list[tuple[str, str, int, object]] = []
    fast = FastEngine(model, tokenizer, [], dtype=args.dtype, max_batch_size=max(args.streams, 1), prefix_cache_mb=0)
    rows += [("gym-fast", args.dtype, 1, fast), ("gym-fast", args.dtype, args.streams, fast)]
    for name, weights, streams, engine in rows:
        plain, constrained, grammar_us = measure(engine, prompt, streams, args.tokens, args.rounds, constraint, clock)
        print(f"{name:<10} {weights:<9} {streams:>7} {plain:>12.1f} {constrained:>18.1f} "
              f"{constrained / plain:>6.2f} {grammar_us:>17.0f}")
    fast.shutdown()
    if not args.no_hf:
        hf = HFEngine(model, tokenizer, [], max_batch_size=1)
        plain, constrained, grammar_us = measure(hf, prompt, 1, args.tokens, args.rounds, constraint, clock)
        print(f"{'gym-hf':<10} {'float32':<9} {1:>7} {plain:>12.1f} {constrained:>18.1f} "
              f"{constrained / plain:>6.2f} {grammar_us:>17.0f}")
        hf.shutdown()


if __name__ == "__main__":
    main()
