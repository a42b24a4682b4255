"""GGUF export of the embedded model at every type: file size, export time, and the perplexity of the written file.

Each file is written by `gym export --format gguf` and read back by transformers' GGUF loader (which dequantizes
every tensor with the gguf package), so the perplexity measures what our quantizers kept; the baseline is the
float32 model, measured in the same run. With --llamacpp (llama-cpp-python installed: `make test-llamacpp`),
llama.cpp itself also computes each file's perplexity on the same tokens.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/export_gguf.py [--types f16,q8_0,q4_k_m] [--llamacpp]
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from gym.export.gguf_file import TYPES
from gym.export.run import run_export
from gym.models.loader import resolve_model_path

REPO = Path(__file__).resolve().parent.parent


def demo_text(tokenizer, tokens: int = 1024) -> torch.Tensor:
    rows = json.loads((REPO / "data" / "alpaca_en_demo.json").read_text())
    text = "\n\n".join(f"{r['instruction']}\n{r['output']}" for r in rows)
    return torch.tensor([tokenizer.encode(text)[:tokens]])


def perplexity(model, ids: torch.Tensor, window: int = 256) -> float:
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, ids.shape[1] - 1, window):
            chunk = ids[:, start:start + window + 1]
            logits = model(chunk[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(logits[0], chunk[0, 1:], reduction="sum")
            total, count = total + float(loss), count + chunk.shape[1] - 1
    return math.exp(total / count)


def perplexity_llamacpp(path: Path, ids: torch.Tensor, window: int = 256) -> float:
    """The same windows as `perplexity` (each scored from a fresh context), computed by llama.cpp."""
    import llama_cpp
    import numpy as np

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=window + 8, n_threads=2, logits_all=True, verbose=False)
    tokens = ids[0].tolist()
    total, count = 0.0, 0
    for start in range(0, len(tokens) - 1, window):
        chunk = tokens[start:start + window + 1]
        llm.reset()
        llm.eval(chunk[:-1])
        scores = np.asarray(llm.scores[:len(chunk) - 1], dtype=np.float64)
        top = scores.max(1)
        log_z = top + np.log(np.exp(scores - top[:, None]).sum(1))
        total += float((log_z - scores[np.arange(len(chunk) - 1), chunk[1:]]).sum())
        count += len(chunk) - 1
    return math.exp(total / count)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--types", default=",".join(TYPES))
    parser.add_argument("--llamacpp", action="store_true", help="also llama.cpp's perplexity of each file")
    args = parser.parse_args()
    source = resolve_model_path("smollm2-135m")
    tokenizer = AutoTokenizer.from_pretrained(source)
    ids = demo_text(tokenizer)
    baseline = perplexity(AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32), ids)
    print(f"embedded model (float32, transformers): perplexity {baseline:.3f} on {ids.shape[1]} tokens of "
          "alpaca_en_demo")
    extra = " llama.cpp perplexity | vs float32 |" if args.llamacpp else ""
    print(f"\n| type | file | export s | perplexity | vs float32 |{extra}\n|---|---|---|---|---|"
          + ("---|---|" if args.llamacpp else ""))
    with tempfile.TemporaryDirectory() as folder:
        for kind in args.types.split(","):
            started = time.perf_counter()
            path = run_export({"model_name_or_path": "smollm2-135m", "export_dir": folder, "export_format": "gguf",
                               "export_type": kind})
            seconds = time.perf_counter() - started
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=path.name, dtype=torch.float32)
            ppl = perplexity(model, ids)
            row = (f"| {kind} | {path.stat().st_size / 2**20:.1f} MiB | {seconds:.1f} | {ppl:.3f} | "
                   f"{100 * (ppl / baseline - 1):+.2f}% |")
            if args.llamacpp:
                theirs = perplexity_llamacpp(path, ids)
                row += f" {theirs:.3f} | {100 * (theirs / baseline - 1):+.2f}% |"
            print(row, flush=True)
            path.unlink()


if __name__ == "__main__":
    main()
