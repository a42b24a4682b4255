"""Decode speed on a CUDA GPU (issue #13): a Qwen3-0.6B-sized model built from its config (random
weights: speed does not depend on their values), bf16, all rows measured in one run.

  bandwidth     a read probe: summing a 4 GiB bf16 tensor on the GPU (GB/s)
  generate      transformers' model.generate, greedy, one stream, dynamic cache (the baseline)
  generate-static  the same with cache_implementation="static", which transformers compiles (its fast path)
  gym-hf        Gym's transformers engine (gym.infer.hf_engine)
  gym-fast      Gym's fast engine on the GPU (gym.infer.fast.gpu): static cache, CUDA-graph decode steps,
                with the eager kernels captured, then (unless skipped) with the layer's pieces compiled
                by torch.compile (infer_compile: true)
  vllm          only where the vllm package is installed
Columns: one stream (--tokens new tokens after a --prompt-tokens prompt), --streams concurrent streams
(aggregate tokens/s), and time to the first token of a --long-prompt-tokens prompt; every answer is
exactly --tokens tokens. Effective bandwidth: bytes of weights read per token x one-stream tokens/s.
Each engine is warmed up (graphs captured, kernels compiled) before it is timed; its start-up time
is printed apart.

    python bench/gpu_speed.py            # on the GPU machine
    python bench/gpu_speed.py --tiny     # a 2-layer model: checks the script itself, on any machine
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import threading
import time

import torch

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

QWEN3_06B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                 rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)
TINY = dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=4096, tie_word_embeddings=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def read_bandwidth(device: torch.device, gib: float) -> float:
    data = torch.ones(int(gib * (1 << 30) / 2), dtype=torch.bfloat16, device=device)
    data.sum(dtype=torch.float32)
    best = float("inf")
    for _ in range(10):
        sync(device)
        start = time.perf_counter()
        data.sum(dtype=torch.float32)
        sync(device)
        best = min(best, time.perf_counter() - start)
    return data.numel() * 2 / best / 1e9


def word_tokenizer(vocab: int):
    """One word per id, so every token a random model emits detokenizes."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    inner = Tokenizer(WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    inner.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=inner, unk_token="w0", pad_token="w0")


def generate_tps(model, prompt: list[int], tokens: int, **options) -> float:
    ids = torch.tensor([prompt], device=model.device)
    with torch.inference_mode():
        for _ in range(2):  # warm-up (the static cache's compilation happens here)
            model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=0,
                           **options)
        sync(model.device)
        start = time.perf_counter()
        out = model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=0,
                             **options)
        sync(model.device)
    return (out.shape[1] - ids.shape[1]) / (time.perf_counter() - start)


def load(engine, prompts: list[list[int]], tokens: int) -> tuple[float, float]:
    """(aggregate tokens/s, mean time to first token): every prompt a client of its own, all at once,
    greedy with no stop token. Greedy, because a random-weight model's next-token distribution is nearly
    flat: top-p sampling would have to sort most of a 152k vocabulary every step, which a trained model's
    peaked distribution never asks for, and the table would measure that sort instead of the decoder."""
    from gym.infer.requests import Piece, SamplingParams

    firsts: list[float] = []
    produced = [0]
    lock = threading.Lock()

    def client(index: int) -> None:
        start = time.perf_counter()
        request = engine.submit(prompts[index], SamplingParams(max_new_tokens=tokens, do_sample=False))
        first = None
        for event in request.events():
            if first is None and isinstance(event, Piece):
                first = time.perf_counter() - start
        with lock:
            firsts.append(first or 0.0)
            produced[0] += len(request.generated)

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return produced[0] / (time.perf_counter() - start), statistics.mean(firsts)


def step_times(decoder, sizes: list[int], repeats: int = 50) -> str:
    """The decoder's own step time (no engine, no sampling) at these batch sizes, 64 positions in."""
    parts = []
    with torch.inference_mode():
        for rows in sizes:
            tokens, lengths = [1] * rows, [64] * rows
            decoder.decode(tokens, lengths)
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(repeats):
                decoder.decode(tokens, lengths)
            torch.cuda.synchronize()
            parts.append(f"{rows} rows {1000 * (time.perf_counter() - start) / repeats:.2f} ms/step")
    return ", ".join(parts)


def engine_row(engine, prompt, streams, long_prompt, tokens) -> tuple[float, float, float]:
    # Warm-up: the long prompt first (growing the cache drops the captured graphs), then one stream and
    # all of them, so no timed run captures a graph.
    load(engine, [long_prompt], 2)
    load(engine, [prompt], 8)
    load(engine, streams, 8)
    one, _ = load(engine, [prompt], tokens)
    many, _ = load(engine, streams, tokens)
    ttft = statistics.median(load(engine, [long_prompt], 1)[1] for _ in range(3))  # no prefix cache: 3 full runs
    return one, many, ttft


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--long-prompt-tokens", type=int, default=1024)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model (checks the script on any machine)")
    parser.add_argument("--skip", default="", help="comma-separated rows to leave out (generate-static, gym-hf, "
                        "gym-fast-eager, gym-fast-compiled)")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))

    from transformers import Qwen3Config, Qwen3ForCausalLM

    from gym.infer.fast.engine import FastEngine
    from gym.infer.hf_engine import HFEngine

    if torch.cuda.is_available():
        torch.set_float32_matmul_precision("high")  # TF32 where anything runs in float32 (the model is bf16)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = TINY if args.tiny else QWEN3_06B
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(Qwen3Config(**shape)).to(dtype).eval()
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    tokenizer = word_tokenizer(shape["vocab_size"])
    g = torch.Generator().manual_seed(0)
    vocab = shape["vocab_size"]
    prompt = torch.randint(0, vocab, (args.prompt_tokens,), generator=g).tolist()
    streams = [torch.randint(0, vocab, (args.prompt_tokens,), generator=g).tolist() for _ in range(args.streams)]
    long_prompt = torch.randint(0, vocab, (args.long_prompt_tokens,), generator=g).tolist()

    probe = read_bandwidth(device, 0.25 if args.tiny or device.type == "cpu" else 4.0)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{name}, torch {torch.__version__}; model {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M "
          f"parameters, {size / 1e9:.2f} GB as {str(dtype).removeprefix('torch.')}; read-bandwidth probe "
          f"{probe:.0f} GB/s")
    print(f"{'engine':<16} {'1 stream tok/s':>15} {'eff. GB/s':>10} {'% of probe':>10} "
          f"{f'{args.streams} streams tok/s':>18} {f'TTFT {args.long_prompt_tokens} tok':>15}  note", flush=True)

    def row(label: str, tps: float, multi: float | None, first: float | None, note: str, nbytes: int = size) -> None:
        gbs = nbytes * tps / 1e9
        multi_text = f"{multi:>18.1f}" if multi is not None else f"{'-':>18}"
        first_text = f"{1000 * first:>13.1f}ms" if first is not None else f"{'-':>15}"
        print(f"{label:<16} {tps:>15.1f} {gbs:>10.0f} {100 * gbs / probe:>9.0f}% {multi_text} {first_text}  {note}",
              flush=True)

    for compiled in (False, True):
        if (device.type != "cuda" and compiled) or f"gym-fast-{'compiled' if compiled else 'eager'}" in skip:
            continue
        started = time.perf_counter()
        fast = FastEngine(model, tokenizer, [], max_batch_size=args.streams, max_waiting=1024, prefix_cache_mb=0,
                          compile=compiled)
        ready = time.perf_counter() - started
        try:
            one, many, ttft = engine_row(fast, prompt, streams, long_prompt, args.tokens)
            decoder = fast.decoder
            graphs = getattr(decoder, "use_graphs", False)
            how = ("graphs" + (", compiled" if decoder.compiled else ", eager kernels")
                   if graphs else "eager")
            steps = step_times(decoder, [1, args.streams]) if device.type == "cuda" else ""
            compile_note = f" (compile {decoder.compile_seconds:.0f}s)" if graphs and decoder.compiled else ""
            row("gym-fast", one, many, ttft, f"{how}; start-up {ready:.0f}s{compile_note}, capture in all "
                f"{getattr(decoder, 'graph_seconds', 0.0):.1f}s; {steps}", decoder.weight_bytes)
        finally:
            fast.shutdown()
    row("generate", generate_tps(model, prompt, args.tokens), None, None, "")
    if "gym-hf" not in skip:
        engine = HFEngine(model, tokenizer, [], max_batch_size=args.streams, max_waiting=1024)
        try:
            row("gym-hf", *engine_row(engine, prompt, streams, long_prompt, args.tokens), "")
        finally:
            engine.shutdown()
    if importlib.util.find_spec("vllm") is None:
        row("vllm", float("nan"), None, None, "not installed here")
    if "generate-static" not in skip:
        try:
            started = time.perf_counter()
            tps = generate_tps(model, prompt, args.tokens, cache_implementation="static")
            row("generate-static", tps, None, None, f"warm-up {time.perf_counter() - started:.0f}s")
        except Exception as exc:  # a transformers version without it: say so in the table, measure the rest
            row("generate-static", float("nan"), None, None, f"failed: {type(exc).__name__}: {exc}"[:120])

if __name__ == "__main__":
    main()
