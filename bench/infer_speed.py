"""Decode speed of Gym's engine on the embedded model, against transformers' generate and against the
machine's own read bandwidth, all measured in one run (the baseline for issue #13).

  bandwidth   a read probe: summing a 1 GiB float32 tensor with torch's threads (GB/s)
  generate    transformers' model.generate, greedy, one stream (the baseline)
  gym         Gym's transformers engine (gym.infer.hf_engine), one stream and --streams concurrent streams
  gym-fast    Gym's fast engine (gym.infer.fast) with weights as each of --fast-dtypes
  ttft        time to the first token for a --long-prompt-token prompt, through the engine: the mean of 3 in a
              row on one engine after a warm-up one, as llama-bench times its prompt (a warm-up, then -r 3)
  llama.cpp   with --llamacpp (`make bench-llamacpp`): llama.cpp built from the llama-cpp-python sdist
              (bench/llamacpp.py), the same model written by its own quantizer as F32 / Q8_0 / Q4_0 / Q4_1;
              1 stream and TTFT from llama-bench (tg --tokens, pp --long-prompt-tokens), the concurrent
              streams through llama-server with that many parallel slots and the same client load
  paired      with --llamacpp and --rounds N: one stream's decode rate and the TTFT of each fast format against
              llama.cpp's at equal bits (float32/F32, int8/Q8_0, int4/Q4_0), N rounds each timing Gym then
              llama-bench back to back; the median ratios and the rounds' ranges. On a machine whose speed
              drifts by 10-30% within minutes, rows measured minutes apart do not compare; a round's two
              timings do. Both sides time decoding alone, as llama-bench's tg does: Gym's rate is the tokens
              after the first over the time after the first (sampled, top-p), the mean of 3 answers on one
              engine after a warm-up one; llama-bench's is tg --tokens, a warm-up then the mean of -r 3. TTFT
              as in the table (Gym's ttft above; llama-bench's pp --long-prompt-tokens), and the --streams
              concurrent streams' aggregate rate as in the table (Gym's engine, then llama-server with that
              many slots): the 16-stream goal's ratio from timings seconds apart, not minutes
Each dtype in --dtypes is measured (bfloat16 only where the CPU has native bf16). Effective bandwidth is
the bytes of weights read per decoded token times tokens/s; `% of probe` compares it with the probe.
Every answer is exactly --tokens tokens (no stop token), so all rows do the same work.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/infer_speed.py [--llamacpp]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # no "Loading weights" bars between table rows


def read_bandwidth(gib: float = 1.0, repeats: int = 5) -> float:
    """GB/s of a streaming read: the ceiling for a decode step that reads every weight once."""
    data = torch.ones(int(gib * (1 << 30) / 4), dtype=torch.float32)
    data.sum()  # fault the pages in
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - start)
    return data.numel() * 4 / best / 1e9


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes read per decoded token: every parameter once (a tied embedding/LM head counts once, as the
    head reads it; the embedding lookup reads one row)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def generate_tps(model, prompt: list[int], tokens: int) -> float:
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=4, do_sample=False, min_new_tokens=4)  # warm-up
        start = time.perf_counter()
        out = model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
        seconds = time.perf_counter() - start
    return (out.shape[1] - ids.shape[1]) / seconds


def engine_tps(model, tokenizer, prompts: list[list[int]], tokens: int, make_engine=None) -> tuple[float, float]:
    """(aggregate tokens/s, mean time to first token) with every prompt a client of its own, all at once:
    bench/serve.py's load (sampled at temperature 0.7, no stop token, so every answer is `tokens` long)."""
    from serve import run_engine  # bench/ is on sys.path when this script runs

    run_engine(model, tokenizer, [prompts[0][:8]], 1, 1, 4, 1, make_engine)  # warm-up
    tps, ttfts = run_engine(model, tokenizer, prompts, len(prompts), 1, tokens, max(16, len(prompts)), make_engine)
    return tps, sum(ttfts) / len(ttfts)


def engine_ttft(model, tokenizer, prompt: list[int], make_engine=None, repetitions: int = 3) -> float:
    """Mean time to the first token of `prompt`, sent `repetitions` times in a row to one engine after one more
    time as a warm-up: as llama-bench times a prompt (a warm-up run, then the mean of its repetitions, -r 3 here)."""
    from serve import run_engine

    _, ttfts = run_engine(model, tokenizer, [prompt], 1, repetitions + 1, 1, 16, make_engine)
    return sum(ttfts[1:]) / repetitions


def fast_engine(model, tokenizer, dtype: str):
    from gym.infer.fast.engine import FastEngine

    # The prefix cache off: every TTFT prompt is computed, never restored. Settled: its weights in huge pages, as
    # a server's are within a second of standing idle (llama-server too has loaded its model before it is timed).
    def make(batch: int) -> FastEngine:
        engine = FastEngine(model, tokenizer, [], dtype=dtype, max_batch_size=batch, max_waiting=1024,
                            prefix_cache_mb=0)
        engine.settle()
        return engine

    return make


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--long-prompt-tokens", type=int, default=1024)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--dtypes", default="float32,bfloat16", help="transformers / HFEngine dtypes")
    parser.add_argument("--fast-dtypes", default="float32,bfloat16,int8,int4", help="Gym's fast engine formats")
    parser.add_argument("--llamacpp", action="store_true", help="also measure llama.cpp (built once, ~10 min)")
    parser.add_argument("--gguf-types", default="F32,Q8_0,Q4_0,Q4_1", help="llama.cpp weight types with --llamacpp")
    parser.add_argument("--rounds", type=int, default=0,
                        help="with --llamacpp: paired rounds of one stream's decode rate and TTFT, Gym then "
                             "llama.cpp, per format (median ratios reported; 0: none)")
    parser.add_argument("--isa", choices=["native", "native-noamx", "avx2"], default="native",
                        help="avx2: Gym's AVX2 kernels (GYM_KERNEL_ISA=avx2) against llama.cpp built for AVX2 only "
                             "(GGML_NATIVE=OFF GGML_AVX2=ON GGML_AVX512=OFF ...): the AVX2 paths of both, on any "
                             "machine that has AVX2; native-noamx: llama.cpp native without AMX, for VMs that list "
                             "AMX without enabling it")
    args = parser.parse_args()
    if args.isa == "avx2":  # before anything loads the kernels; llamacpp.py reads its own variable
        os.environ["GYM_KERNEL_ISA"] = "avx2"
    os.environ["GYM_BENCH_ISA"] = args.isa  # native-noamx: llama.cpp native without AMX (Gym's kernels use none)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gym.core.hardware import cpu_supports_bf16
    from gym.models.loader import resolve_model_path

    path = resolve_model_path("smollm2-135m")
    tokenizer = AutoTokenizer.from_pretrained(path)
    text = " ".join(f"The number {i} follows {i - 1}." for i in range(1, 2000))
    ids = tokenizer.encode(text, add_special_tokens=False)
    prompt = ids[: args.prompt_tokens]
    streams = [ids[i * 7: i * 7 + args.prompt_tokens] for i in range(args.streams)]
    long_prompt = ids[: args.long_prompt_tokens]

    from gym.infer.fast.kernels import kernel_isa

    probe = read_bandwidth()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, native bf16: {cpu_supports_bf16()}; "
          f"read-bandwidth probe {probe:.1f} GB/s")
    print(f"CPU: {cpu_summary()}; Gym's kernels: {kernel_isa() or 'not available'}; llama.cpp: "
          f"{ {'avx2': 'AVX2 only', 'native-noamx': 'native without AMX'}.get(args.isa, 'native')} (--isa {args.isa})")
    print(f"{'engine':<10} {'dtype':<9} {'1 stream tok/s':>15} {'eff. GB/s':>10} {'% of probe':>10} "
          f"{f'{args.streams} streams tok/s':>18} {f'TTFT {args.long_prompt_tokens} tok':>15}")
    for name in filter(None, args.dtypes.split(",")):
        if name == "bfloat16" and not cpu_supports_bf16():
            print(f"{'-':<10} {name:<9} skipped: this CPU has no native bf16")
            continue
        dtype = getattr(torch, name)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
        size = weight_bytes(model)
        base = generate_tps(model, prompt, args.tokens)
        one, _ = engine_tps(model, tokenizer, [prompt], args.tokens)
        many, _ = engine_tps(model, tokenizer, streams, args.tokens)
        ttft = engine_ttft(model, tokenizer, long_prompt)
        for label, tps, multi, first in (("generate", base, None, None), ("gym", one, many, ttft)):
            gbs = size * tps / 1e9
            multi_text = f"{multi:>18.1f}" if multi is not None else f"{'-':>18}"
            first_text = f"{first:>14.2f}s" if first is not None else f"{'-':>15}"
            print(f"{label:<10} {name:<9} {tps:>15.1f} {gbs:>10.1f} {100 * gbs / probe:>9.0f}% {multi_text} "
                  f"{first_text}")
    from gym.infer.fast.cpu import FastDecoder
    from gym.infer.fast.kernels import kernel_status

    missing = kernel_status()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for name in args.fast_dtypes.split(","):
        size = FastDecoder(model, name, slots=1).weight_bytes
        make = fast_engine(model, tokenizer, name)
        one, _ = engine_tps(model, tokenizer, [prompt], args.tokens, make)
        many, _ = engine_tps(model, tokenizer, streams, args.tokens, make)
        ttft = engine_ttft(model, tokenizer, long_prompt, make)
        gbs = size * one / 1e9
        print(f"{'gym-fast':<10} {name:<9} {one:>15.1f} {gbs:>10.1f} {100 * gbs / probe:>9.0f}% {many:>18.1f} "
              f"{ttft:>14.2f}s")
    if missing:
        print(f"(gym-fast ran its torch reference: the kernels are not available: {missing})")
    if args.llamacpp:
        llamacpp_rows(streams, long_prompt, args, probe)
        if args.rounds > 0:
            paired_rounds(model, tokenizer, prompt, long_prompt, streams, args)


def cpu_summary() -> str:
    """The CPU's model and its vector extensions, as the table's header records them."""
    model, flags = platform.processor() or "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model == (platform.processor() or "unknown CPU"):
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    wanted = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8")
    return f"{model} [{' '.join(f for f in wanted if f in flags) or 'no AVX2'}]"


def llamacpp_rows(streams: list[list[int]], long_prompt: list[int], args, probe: float) -> None:
    import llamacpp  # bench/llamacpp.py

    threads = torch.get_num_threads()
    from gym.models.loader import embedded_gguf_path

    files = llamacpp.gguf_files(embedded_gguf_path("smollm2-135m"), tuple(args.gguf_types.split(",")))
    for kind, file in files.items():
        rates = llamacpp.llama_bench(file, threads=threads, prompt=len(long_prompt), generate=args.tokens)
        many = llama_server_tps(file, streams, args.tokens, threads)
        # Bytes read per token: the whole file (the tied embedding is read as the LM head).
        gbs = file.stat().st_size * rates["decode"] / 1e9
        print(f"{'llama.cpp':<10} {kind:<9} {rates['decode']:>15.1f} {gbs:>10.1f} {100 * gbs / probe:>9.0f}% "
              f"{many:>18.1f} {len(long_prompt) / rates['prefill']:>14.2f}s")


PAIRS = {"float32": "F32", "int8": "Q8_0", "int4": "Q4_0"}  # Gym's format and llama.cpp's at equal bits


def engine_decode_tps(model, tokenizer, prompt: list[int], tokens: int, make_engine, repetitions: int = 3) -> float:
    """One stream's decode rate on one engine: the mean over `repetitions` answers, after a warm-up one, of the
    tokens after the first over the time after the first, as llama-bench's tg times decoding alone."""
    from gym.infer.requests import Piece, SamplingParams

    engine = make_engine(1)
    rates = []
    try:
        for r in range(repetitions + 1):
            request = engine.submit(prompt, SamplingParams(max_new_tokens=tokens, do_sample=True, temperature=0.7,
                                                           top_p=0.9, seed=r))
            first = None
            for event in request.events():
                if first is None and isinstance(event, Piece):
                    first = time.perf_counter()
            if r and first is not None and len(request.generated) > 1:
                rates.append((len(request.generated) - 1) / (time.perf_counter() - first))
    finally:
        engine.shutdown()
    return sum(rates) / len(rates)


def paired_rounds(model, tokenizer, prompt: list[int], long_prompt: list[int], streams: list[list[int]],
                  args) -> None:
    import statistics

    import llamacpp

    from gym.models.loader import embedded_gguf_path

    wanted = [(fast, gguf) for fast, gguf in PAIRS.items()
              if fast in args.fast_dtypes.split(",") and gguf in args.gguf_types.split(",")]
    files = llamacpp.gguf_files(embedded_gguf_path("smollm2-135m"), tuple(gguf for _, gguf in wanted))
    threads = torch.get_num_threads()
    print(f"\nGym then llama.cpp back to back, {args.rounds} rounds per format: one stream's decode rate "
          f"({args.tokens} tokens), TTFT ({len(long_prompt)} tokens) and {len(streams)} streams' aggregate rate "
          f"(llama-server); medians, ratios Gym / llama.cpp:")
    print(f"{'format':<14} {'Gym tok/s':>10} {'llama.cpp':>10} {'ratio':>7} {'rounds':>11} | {'Gym TTFT':>9} "
          f"{'llama.cpp':>10} {'ratio':>7} {'rounds':>11} | {'Gym streams':>11} {'server':>10} {'ratio':>7} "
          f"{'rounds':>11}")

    def medians(ours: list[float], theirs: list[float], width: int, unit: str = "", decimals: int = 1) -> str:
        """Both sides' medians, the median of the rounds' ratios and their range, as one row's columns."""
        ratios = sorted(a / b for a, b in zip(ours, theirs, strict=True))
        return (f"{statistics.median(ours):>{width - len(unit)}.{decimals}f}{unit} "
                f"{statistics.median(theirs):>{10 - len(unit)}.{decimals}f}{unit} "
                f"{statistics.median(ratios):>6.2f}x {ratios[0]:>5.2f}-{ratios[-1]:.2f}x")

    for fast, gguf in wanted:
        make = fast_engine(model, tokenizer, fast)
        rounds = []
        for _ in range(args.rounds):
            ours = engine_decode_tps(model, tokenizer, prompt, args.tokens, make)
            ours_ttft = engine_ttft(model, tokenizer, long_prompt, make)
            theirs = llamacpp.llama_bench(files[gguf], threads=threads, prompt=len(long_prompt), generate=args.tokens)
            ours_many, _ = engine_tps(model, tokenizer, streams, args.tokens, make)
            theirs_many = llama_server_tps(files[gguf], streams, args.tokens, threads)
            rounds.append((ours, theirs["decode"], ours_ttft, len(long_prompt) / theirs["prefill"], ours_many,
                           theirs_many))
        column = [[r[i] for r in rounds] for i in range(6)]
        print(f"{fast + ' / ' + gguf:<14} {medians(column[0], column[1], 10)} | "
              f"{medians(column[2], column[3], 9, unit='s', decimals=2)} | {medians(column[4], column[5], 11)}",
              flush=True)


def llama_server_tps(file, streams: list[list[int]], tokens: int, threads: int) -> float:
    """Aggregate tokens/s of llama-server answering every stream at once, one slot each."""
    import threading

    import llamacpp

    context = max(len(p) for p in streams) + tokens + 16
    with llamacpp.LlamaServer(file, threads=threads, parallel=len(streams), context_per_slot=context) as server:
        server.complete(streams[0][:8], 4, seed=0)  # warm-up
        produced = [0] * len(streams)

        def client(i: int) -> None:
            produced[i], _ = server.complete(streams[i], tokens, seed=i)

        workers = [threading.Thread(target=client, args=(i,)) for i in range(len(streams))]
        start = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        return sum(produced) / (time.perf_counter() - start)


if __name__ == "__main__":
    main()
