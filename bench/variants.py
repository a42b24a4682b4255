"""Many variants of one base in one batch (issue #14): memory and decode speed for N variants, against the
base alone, N merged models, and swapping merged weights per variant - all measured in one run.

The variants are SYNTHETIC: 1-bit deltas with random signs on every attention and MLP projection (what a
LoRA-trained BitDelta variant from PersonalizedTrainer changes), one scale per matrix. Speed and memory do
not depend on which signs a delta holds; that a real variant's rows get its merged model's numbers is
what tests/personalization/test_batched.py checks. One variant is written to disk as a Gym delta file and
read back, so the per-variant disk size is the real file's.

Rows of the table, for each N in --counts (a batch of --batch rows; row r of step s uses variant
(s * batch + r) mod N, so over the run every variant is used and each step mixes min(N, batch) of them):
  resident      memory the N compiled variants take in this process (RSS growth) and per variant
  disk          bytes of one variant's delta file
  mixed         tokens/s of decode steps mixing the N variants (each base product once, per-row deltas)
  base          tokens/s of the same steps with every row on the base: the ceiling
  mixed / base  the median over --rounds rounds, each timing base then mixed back to back, and the rounds'
                range: a shared machine's speed drifts by tens of percent within a minute, so a ratio is only
                trusted from timings taken side by side, and the median of several
  merged        tokens/s if each variant were its own merged model: the rows of a step split into one
                smaller batch per model, run one after another (timed on the base decoder, whose shapes
                a merged model shares); memory = N x the served model. "-" where N models exceed --memory-gib
  swap          tokens/s when one model swaps weights: per step, merge each distinct variant into the
                base and rebuild the served weights (timed), decode its rows, and so on
  unpacked      N=16 only: the mixed step with 1-bit deltas expanded to float matrices in a --cache-mb LRU
                instead of the packed kernel (the memory/speed trade-off)

    HF_HUB_OFFLINE=1 .venv/bin/python bench/variants.py [--dtype int8] [--counts 1,4,16,64,1000]
On a CUDA GPU (`--qwen3-0.6b`: a Qwen3-0.6B-sized model from its config, random weights, bf16) the same rows
run through the GPU decoder, whose 1-bit deltas are expanded into the cache (no packed GPU kernel yet).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

QWEN3_06B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
                 tie_word_embeddings=True, rope_theta=1_000_000.0)


def resident_bytes(device: torch.device) -> int:
    """Process RSS on the CPU (after handing freed heap back, so the number is what is held); allocated
    GPU memory on a GPU."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def projections(model) -> dict[str, torch.Tensor]:
    """The attention and MLP weights: what a LoRA fine-tune (and so its BitDelta) changes."""
    return {name: p for name, p in model.named_parameters() if p.dim() == 2 and ".layers." in name}


def synthetic_deltas(model, seed: int, device: torch.device):
    from gym.infer.fast.deltas import SignDelta

    g = torch.Generator(device=device).manual_seed(seed)
    deltas = {}
    for name, weight in projections(model).items():
        out_features, in_features = weight.shape
        bits = torch.randint(0, 256, (out_features * in_features // 8,), dtype=torch.uint8, generator=g, device=device)
        alpha = float(weight.abs().mean()) * 0.02
        deltas[name] = SignDelta(bits, torch.full((out_features, 1), alpha, device=device), in_features,
                                 (out_features, in_features))
    return deltas


def disk_bytes(model, deltas, folder: Path) -> tuple[int, dict]:
    """Write one variant as a Gym delta file and read it back: (file bytes, its deltas as the engine loads them)."""
    from gym.delta.format import fingerprint, save_delta
    from gym.delta.tensor_quant import Encoded, QuantMethod
    from gym.personalization.loading import deltas_from_file

    entries = {name: Encoded(QuantMethod.BINARY, d.shape, {"codes": d.bits.cpu(),
                                                           "scale": d.scales[:1, :1].half().cpu()},
                             {"granularity": "tensor", "group_size": None, "symmetric": True, "clip_percentile": None})
               for name, d in deltas.items()}
    base = {"name": "bench", "fingerprint": fingerprint({n: p for n, p in model.named_parameters()})}
    path = save_delta(folder / "variant.safetensors", entries, {"method": "bitdelta", "base": base})
    return path.stat().st_size, deltas_from_file(path)[0]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_seconds(decoder, batch: int, prompt: int, steps: int, variants_for_step, device) -> float:
    """Mean seconds of a decode step over `steps`, after two warm-up steps, from a fresh `prompt`-token cache."""
    lengths = [prompt] * batch
    tokens = list(range(100, 100 + batch))
    for step in range(steps + 2):
        if step == 2:
            sync(device)
            started = time.perf_counter()
        decoder.decode(tokens, lengths, variants_for_step(step))
        lengths = [n + 1 for n in lengths]
    sync(device)
    return (time.perf_counter() - started) / steps


def swap_seconds(model, deltas, dtype: str, make_decoder) -> float:
    """Merge one variant into the base weights and rebuild the served weights from them, then take it out."""
    weights = projections(model)
    started = time.perf_counter()
    with torch.no_grad():
        for name, delta in deltas.items():
            weights[name].add_(delta.dense().to(weights[name].dtype))
        decoder = make_decoder(model)
        for name, delta in deltas.items():
            weights[name].sub_(delta.dense().to(weights[name].dtype))
    seconds = time.perf_counter() - started
    del decoder
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--counts", default="1,4,16,64,1000")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5, help="base/mixed timing pairs per N (median reported)")
    parser.add_argument("--dtype", default="int8", help="served weights on the CPU (float32, bfloat16, int8, int4)")
    parser.add_argument("--cache-mb", type=int, default=1024, help="the unpacked-delta LRU (infer_variant_cache_mb)")
    parser.add_argument("--memory-gib", type=float, default=24.0, help="the machine's memory, for the merged rows")
    parser.add_argument("--qwen3-0.6b", dest="qwen", action="store_true", help="a Qwen3-0.6B-sized model (GPU runs)")
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]

    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

    from gym.infer.fast.cpu import FastDecoder
    from gym.infer.fast.deltas import UnpackedCache, compile_variant
    from gym.infer.fast.gpu import GpuDecoder
    from gym.infer.fast.kernels import kernel_status
    from gym.models.loader import resolve_model_path

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    if args.qwen:
        with torch.device(device):
            model = Qwen3ForCausalLM(Qwen3Config(**QWEN3_06B)).to(
                torch.bfloat16 if device.type == "cuda" else torch.float32).eval()
        label = "Qwen3-0.6B-sized (random weights)"
    else:
        model = AutoModelForCausalLM.from_pretrained(resolve_model_path("smollm2-135m"), dtype=torch.float32).eval()
        model.to(device)
        label = "SmolLM2-135M-Instruct (embedded)"
    model.requires_grad_(False)
    slots = args.batch

    def make_decoder(m):
        if device.type == "cuda":
            return GpuDecoder(m, slots=slots, max_length=1024, graphs=False)
        decoder = FastDecoder(m, args.dtype, slots=slots, max_length=1024)
        decoder.into_huge_pages()  # as a settled engine holds them
        return decoder

    decoder = make_decoder(model)
    embedding = model.model.embed_tokens.weight
    served_bytes = decoder.weight_bytes + embedding.numel() * embedding.element_size()
    print(f"# {label} on {device} ({'GPU decoder, eager' if device.type == 'cuda' else args.dtype}); kernels: "
          f"{kernel_status() or 'built'}; batch {args.batch}, {args.steps} decode steps after a {args.prompt_tokens}"
          "-token prompt; synthetic 1-bit variants")
    print(f"# served model: {served_bytes / 1e6:.0f} MB")
    step_seconds(decoder, args.batch, args.prompt_tokens, args.steps, lambda s: None, device)  # first touches
    base_step = step_seconds(decoder, args.batch, args.prompt_tokens, args.steps, lambda s: None, device)
    rows_time = {rows: step_seconds(decoder, rows, args.prompt_tokens, args.steps, lambda s: None, device)
                 for rows in sorted({max(1, args.batch // min(n, args.batch)) for n in counts})}
    print(f"# base alone: {args.batch / base_step:.1f} tok/s ({base_step * 1e3:.1f} ms/step)", flush=True)

    first = synthetic_deltas(model, 0, device)
    swap = swap_seconds(model, first, args.dtype, make_decoder)
    with tempfile.TemporaryDirectory() as folder:
        on_disk, from_file = disk_bytes(model, first, Path(folder))
    del first
    print(f"# one variant on disk: {on_disk / 1e6:.2f} MB; one swap (merge, rebuild served weights, unmerge): "
          f"{swap:.2f} s", flush=True)

    header = ("| N | variants held MB (per variant) | process GB | disk MB / variant | mixed tok/s | base tok/s | "
              "mixed / base (rounds' range) | merged tok/s | merged memory GB | swap tok/s |")
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    cache = UnpackedCache(args.cache_mb << 20)
    compiled = []
    gc.collect()
    before = resident_bytes(device)
    print(f"# process before variants: {before / 1e9:.2f} GB", flush=True)
    for n in counts:
        while len(compiled) < n:
            index = len(compiled)
            deltas = from_file if index == 0 and device.type == "cpu" else synthetic_deltas(model, index, device)
            compiled.append(compile_variant(f"user{index}", "1", deltas, model, cache, device))
            del deltas
        gc.collect()
        held = sum(variant.nbytes for variant in compiled)
        process = resident_bytes(device)
        rounds = []
        for _ in range(args.rounds):
            base_round = step_seconds(decoder, args.batch, args.prompt_tokens, args.steps, lambda s: None, device)
            mixed_round = step_seconds(
                decoder, args.batch, args.prompt_tokens, args.steps,
                lambda s, n=n: [compiled[(s * args.batch + r) % n] for r in range(args.batch)], device)
            rounds.append((base_round, mixed_round))
        base_n = statistics.median(b for b, _ in rounds)
        mixed = statistics.median(m for _, m in rounds)
        ratios = sorted(b / m for b, m in rounds)
        groups = min(n, args.batch)
        merged_step = groups * rows_time[max(1, args.batch // groups)]
        merged_memory = n * served_bytes
        fits = merged_memory <= args.memory_gib * 2**30
        swap_step = groups * swap + merged_step
        print(f"| {n} | {held / 1e6:.0f} ({held / n / 1e6:.1f}) | {process / 1e9:.2f} | {on_disk / 1e6:.2f} | "
              f"{args.batch / mixed:.1f} | {args.batch / base_n:.1f} | {statistics.median(ratios):.0%} "
              f"({ratios[0]:.0%}-{ratios[-1]:.0%}) | "
              f"{args.batch / merged_step:.1f}{'' if fits else ' (does not fit)'} | {merged_memory / 1e9:.1f} | "
              f"{args.batch / swap_step:.2f} |", flush=True)
        if n == 16 and device.type == "cpu":
            for variant in compiled[:16]:
                variant.packed = False
            unpacked = step_seconds(decoder, args.batch, args.prompt_tokens, args.steps,
                                    lambda s: [compiled[(s * args.batch + r) % 16] for r in range(args.batch)], device)
            for variant in compiled[:16]:
                variant.packed = True
            print(f"| 16, unpacked into a {args.cache_mb} MB LRU | cache {cache.used / 1e6:.0f} MB, {cache.evictions} "
                  f"evictions | | | {args.batch / unpacked:.1f} | | {base_n / unpacked:.0%} | | | |", flush=True)
            cache.clear()


if __name__ == "__main__":
    main()
