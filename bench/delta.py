"""Delta compression on the embedded model: every method, for a LoRA and a full fine-tune, in one run.

1. Fine-tune SmolLM2-135M-Instruct twice with Gym (sft on the first rows of alpaca_en_demo plus
   identity): LoRA (r=16, all linear layers) and full. The last 64 alpaca rows are held out.
2. Compress each fine-tune with every method, apply it to the base, and evaluate on the held-out rows.
3. Print a table: file bytes, ratio against the whole fine-tuned model in fp16, eval loss (base /
   fine-tune / reconstruction), the share of the fine-tune's gain kept, and seconds to compress.

The baseline is the fine-tune itself, measured in the same run: "gain kept" is
(loss_base - loss_reconstruction) / (loss_base - loss_finetune).

    python bench/delta.py [--steps 60] [--distill-steps 200] [--only lora|full] [--methods bitdelta,int4]

Method names: bitdelta (Gym's defaults), bitdelta-distill-emb (the embedding's scales distilled too),
bitdelta-b4 (the paper's batch of 4), bitdelta-nodistill, bitdelta-dense-emb (embedding stored dense),
and the DeltaQuant methods int8, int4, int2, ternary, binary (per-channel scales).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HELD_OUT = 64


def held_out_split(work: Path) -> tuple[str, int]:
    """A dataset_dir holding the demo sets plus `heldout`: the last 64 alpaca rows, never trained on."""
    info = json.loads((REPO / "data" / "dataset_info.json").read_text())
    rows = json.loads((REPO / "data" / "alpaca_en_demo.json").read_text())
    (work / "heldout.json").write_text(json.dumps(rows[-HELD_OUT:]))
    for entry in info.values():
        if "file_name" in entry:
            entry["file_name"] = str(REPO / "data" / entry["file_name"])
    info["heldout"] = {"file_name": str(work / "heldout.json")}
    (work / "dataset_info.json").write_text(json.dumps(info))
    return str(work), len(rows) - HELD_OUT


def fine_tune(kind: str, steps: int, work: Path, dataset_dir: str, n_train: int) -> Path:
    from gym.workflows.training import run_exp

    out = work / f"ft-{kind}"
    config = {"stage": "sft", "finetuning_type": kind, "dataset": "identity,alpaca_en_demo",
              "dataset_dir": dataset_dir, "max_samples": n_train, "cutoff_len": 512,
              "per_device_train_batch_size": 4, "max_steps": steps, "seed": 42, "save_strategy": "no",
              "output_dir": str(out), "disable_tqdm": True, "logging_steps": 10,
              "learning_rate": 2e-4 if kind == "lora" else 2e-5}
    if kind == "lora":
        config.update(lora_rank=16)
    run_exp(config)
    return out


def quantizer(method: str, distill_steps: int, dataset_dir: str):
    from gym.quantization import BitDeltaConfig, BitDeltaQuantizer, DeltaQuantConfig, DeltaQuantizer

    if method.startswith("bitdelta"):
        steps = 0 if method.endswith("nodistill") else distill_steps
        return BitDeltaQuantizer(BitDeltaConfig(distill_steps=steps, calibration="alpaca_en_demo" if steps else None,
                                                calibration_dir=dataset_dir,
                                                distill_batch_size=4 if method.endswith("-b4") else 1,
                                                distill_embeddings=method.endswith("-distill-emb"),
                                                compress_embeddings=not method.endswith("dense-emb")))
    return DeltaQuantizer(DeltaQuantConfig(method=method))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--distill-steps", type=int, default=200)
    parser.add_argument("--only", choices=["lora", "full"])
    parser.add_argument("--methods", default="bitdelta,bitdelta-distill-emb,bitdelta-b4,bitdelta-nodistill,"
                        "bitdelta-dense-emb,int8,int4,int2,ternary,binary")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import logging

    logging.disable(logging.WARNING)
    import transformers

    transformers.utils.logging.disable_progress_bar()
    from gym.delta.apply import apply_delta
    from gym.delta.evaluate import GainKept, eval_loss, eval_rows
    from gym.delta.format import load_delta
    from gym.delta.weights import load_model
    from gym.models.loader import load_tokenizer, resolve_model_path

    base_path = resolve_model_path(None)
    tokenizer = load_tokenizer(base_path)
    methods = args.methods.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        dataset_dir, n_train = held_out_split(work)
        rows = eval_rows(tokenizer, "heldout", dataset_dir, cutoff_len=512, max_samples=None)
        base = load_model(base_path)
        base_loss = eval_loss(base, rows)
        fp16_bytes = 2 * sum(p.numel() for p in base.parameters())
        kinds = [args.only] if args.only else ["lora", "full"]
        print(f"Embedded SmolLM2-135M; {len(rows)} held-out rows; whole model in fp16: {fp16_bytes / 1e6:.1f} MB; "
              f"base eval loss {base_loss:.4f}")
        for kind in kinds:
            started = time.perf_counter()
            tuned_dir = fine_tune(kind, args.steps, work, dataset_dir, n_train)
            tuned = load_model(str(tuned_dir), base_path)
            tuned_loss = eval_loss(tuned, rows)
            print(f"\n{kind} fine-tune: {args.steps} steps in {time.perf_counter() - started:.0f} s, eval loss "
                  f"{tuned_loss:.4f} (gain {base_loss - tuned_loss:.4f})")
            print("| method | bytes | vs fp16 model | eval loss (reconstruction) | gain kept | compress s |")
            print("|---|---:|---:|---:|---:|---:|")
            for method in methods:
                result = quantizer(method, args.distill_steps, dataset_dir).compress(
                    base, tuned, tokenizer=tokenizer, base_name="smollm2-135m", progress=False)
                path = result.save(work / f"{kind}-{method}.safetensors")
                entries, header = load_delta(path)
                rebuilt = apply_delta(load_model(base_path), entries, header, path)
                gain = GainKept(base_loss, tuned_loss, eval_loss(rebuilt, rows))
                size = path.stat().st_size
                print(f"| {method} | {size:,} | {fp16_bytes / size:.1f}x | {gain.reconstructed_loss:.4f} | "
                      f"{100 * gain.kept:.1f}% | {result.seconds:.1f} |", flush=True)


if __name__ == "__main__":
    main()
