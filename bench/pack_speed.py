"""Packing the embedded model's weights into int8/int4: the compiled packer (csrc/pack.cpp) against the torch
reference it reproduces byte for byte (gym.infer.fast.kernels), both in one run, per weight shape (issue #43: the
first start after install packs every weight).

The whole model is packed by the compiled packer; the reference packs one matrix of each shape (it takes ~10 s for
the whole model), and the table gives both per shape and the whole model's compiled time. Run in a worker thread,
as the engine's start-up runs, on torch's intra-op threads.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/pack_speed.py
"""

from __future__ import annotations

import threading
import time

import torch

from gym.infer.fast import kernels
from gym.infer.fast.direct import load_direct
from gym.models.loader import resolve_model_path


def timed(function, weight: torch.Tensor) -> float:
    started = time.perf_counter()
    function(weight)
    return time.perf_counter() - started


def main() -> None:
    if kernels.kernel_status() is not None:
        raise SystemExit(f"the compiled kernels are not available: {kernels.kernel_status()}")
    model, reason = load_direct(resolve_model_path("smollm2-135m"))
    assert model is not None, reason
    weights = [p.detach() for _, p in model.named_parameters() if p.dim() == 2]
    print(f"kernels: {kernels.kernel_isa()}, {torch.get_num_threads()} threads; "
          f"{sum(w.numel() for w in weights) / 1e6:.1f}M weights in {len(weights)} matrices\n")
    print("| format | shape | compiled (ms) | torch reference (ms) | ratio | bytes equal |")
    print("|---|---|---:|---:|---:|---|")
    for fmt, pack in (("int8", kernels.pack_int8), ("int4", kernels.pack_int4)):
        for weight in {tuple(w.shape): w for w in weights}.values():
            compiled = min(timed(pack, weight) for _ in range(3))
            kernels._state["ok"] = False
            try:
                reference_started = time.perf_counter()
                expected = pack(weight)
                reference = time.perf_counter() - reference_started
            finally:
                kernels._state["ok"] = True
            equal = all(torch.equal(a, b) for a, b in zip(pack(weight), expected, strict=True))
            print(f"| {fmt} | {tuple(weight.shape)} | {compiled * 1e3:.1f} | {reference * 1e3:.0f} | "
                  f"{reference / compiled:.1f}x | {equal} |")
        whole = sum(timed(pack, w) for w in weights)
        print(f"| {fmt} | whole model, compiled | {whole * 1e3:.0f} | | | |")


if __name__ == "__main__":
    worker = threading.Thread(target=main)
    worker.start()
    worker.join()
