"""The fast decoder's step alone (no engine thread, no sampling: greedy argmax) on the embedded model:
every layer in one kernel call (kernels.decode_layers, what the engine runs) against the layer-by-layer
walk through the same kernels from Python (the baseline), in one run, interleaved, best of three.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/decode_step.py [--rows 1,16] [--dtypes int8,float32,int4]

Each measurement: a 32-token prompt prefilled into every row's slot, then 64 decode steps.
"""

from __future__ import annotations

import argparse
import time

import torch


def step_seconds(decoder, rows: int, steps: int = 64) -> float:
    prompt = list(range(1000, 1032))
    for slot in range(rows):
        decoder.prefill(slot, prompt, 0)
    tokens = [5] * rows
    start = time.perf_counter()
    for i in range(steps):
        tokens = decoder.decode(tokens, [len(prompt) + i] * rows).argmax(-1).tolist()
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1,16")
    parser.add_argument("--dtypes", default="int8,float32,int4")
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM

    from gym.infer.fast.cpu import FastDecoder
    from gym.infer.fast.kernels import kernel_status
    from gym.models.loader import resolve_model_path

    if kernel_status() is not None:
        raise SystemExit(f"the kernels are not built here: {kernel_status()}")
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("smollm2-135m"), dtype=torch.float32).eval()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; ms per step, best of 3")
    print(f"{'dtype':<8} {'rows':>4} {'layer by layer':>15} {'one call':>9} {'tok/s before':>13} {'tok/s after':>12} "
          f"{'speed-up':>9}")
    for rows in (int(r) for r in args.rows.split(",")):
        for dtype in args.dtypes.split(","):
            one_call = FastDecoder(model, dtype, slots=rows)
            walked = FastDecoder(model, dtype, slots=rows)
            walked.compiled = False  # the layer-by-layer walk; its kernels are the same compiled ones
            for decoder in (one_call, walked):
                decoder.into_huge_pages()  # as a settled engine holds them
            best = {"walked": float("inf"), "one call": float("inf")}
            with torch.inference_mode():
                for _ in range(3):
                    for name, decoder in (("walked", walked), ("one call", one_call)):
                        best[name] = min(best[name], step_seconds(decoder, rows))
            before, after = best["walked"], best["one call"]
            print(f"{dtype:<8} {rows:>4} {1000 * before:>15.2f} {1000 * after:>9.2f} {rows / before:>13.1f} "
                  f"{rows / after:>12.1f} {before / after:>8.2f}x", flush=True)


if __name__ == "__main__":
    main()
